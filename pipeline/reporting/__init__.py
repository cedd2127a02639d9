"""What a finished run reads back: the track summaries and the HTML report (report.py, its Run section:
report_meta.py), the dataset pages (viewer.py + viewer_assets/), the tables one level deeper (breakdown.py) and
across seeds (seeds.py), the offline ``dvc plots`` page (vega.py). It reads the stages' outputs; it runs no stage."""
