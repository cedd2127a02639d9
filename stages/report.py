"""report: every stage's metrics into the track summaries and one HTML page (``curio report``,
pipeline/reporting/report.py)."""

from __future__ import annotations

from pipeline.core.stage import Out, Stage

STAGE = Stage(
    "report",
    params=[],
    cmd="curio report",
    code=["pipeline/reporting/report.py", "pipeline/reporting/viewer.py", "pipeline/reporting/viewer_assets",
          "pipeline/reporting/breakdown.py", "pipeline/reporting/seeds.py"],
    # the datasets its pages show are not deps: every stage that writes one writes its metrics/stages/NAME.json
    # too, so the report reruns after it; and a DAG without some of them (a subset, an experiment) still reports
    data=["metrics/stages", "metrics/plots"],
    metrics=[Out("metrics/text_success.json", cache=False, note="held-out success per policy"),
             Out("metrics/nethack_return.json", cache=False, note="mean evaluation return per agent")],
    outs=[Out("data/report.html"),
          Out("data/report_pages", note="one offline page per dataset (pipeline/reporting/viewer.py)")],
    track="summary",
    doc=("Reads every stage's metrics/stages/NAME.json and metrics/plots/ (pipeline/reporting/report.py): writes the "
         "track summaries, the only files declared as metrics (`dvc metrics show` fits a terminal), one HTML page, and "
         "an offline page per dataset beside it (pipeline/reporting/viewer.py)."),
)
