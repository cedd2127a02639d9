"""`curio report`: the track summaries DVC declares as metrics, and one offline HTML page a browser renders."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
from conftest import REPO, curio, make_project
from PIL import Image

from pipeline.reporting.report import binomial_se, labeller_rows, ledger_rows, matched_steps, render, summaries

EVAL_TEXT = {"base/success_rate": 0.25, "base/episodes": 48, "base/mean_turns": 9.0,
             "sft/success_rate": 0.5, "sft/episodes": 48, "sft/mean_turns": 8.0,
             "base/twenty_questions/success_rate": 0.25,  # per group: detail only, not a headline
             "environment_requests": 12, "environment_cache_hits": 2, "environment_tokens_in": 900,
             "environment_tokens_out": 40, "environment_unique_requests": 10}
EVAL_NETHACK = {"random/return": -1.5, "random/return_sem": 0.5, "random/episodes": 8,
                "motif/return": 2.0, "motif/return_sem": 0.25, "motif/episodes": 8}


def test_headlines_pick_one_number_per_policy():
    heads = summaries({"evaluate-text": EVAL_TEXT, "evaluate-nethack": EVAL_NETHACK, "train-policy": {"x": 1}})
    assert heads == {"text": {"success": {"base": 0.25, "sft": 0.5}},
                     "nethack": {"return": {"random": -1.5, "motif": 2.0}}}
    assert binomial_se(0.5, 100) == 0.05  # sqrt(.5 * .5 / 100)
    rows = ledger_rows({"evaluate-text": EVAL_TEXT})
    assert rows == [["evaluate-text", "environment", 12, 2, "", 900, 40, "", ""]]


def test_the_report_lists_policies_in_pipeline_order(tmp_path):
    """The metrics files hold their keys sorted by name (base, dpo, rl, sft); the report's tables and bars list the
    policies as the pipeline makes them, NetHack's random agent first."""
    text = {f"{p}/{k}": v for p in ("base", "dpo", "rl", "sft") for k, v in
            (("success_rate", 0.5), ("episodes", 8), ("mean_turns", 9.0))}
    nethack = {f"{a}/return": 1.0 for a in ("extrinsic", "intrinsic", "motif", "random")}
    page = render(tmp_path, tmp_path / "dvc.yaml", {"evaluate-text": text, "evaluate-nethack": nethack}, "run")

    def first_column(title: str) -> list[str]:
        body = page[page.index(f"<h2>{title}</h2>"):]
        return re.findall(r"<tr><td>([\w-]+)</td>", body[:body.index("</table>")])
    assert first_column("Headline: text track") == ["base", "sft", "dpo", "rl"]
    assert first_column("Text track: held-out evaluation") == ["base", "sft", "dpo", "rl"]
    assert first_column("Headline: nethack track") == ["random", "extrinsic", "intrinsic", "motif"]
    assert list(summaries({"evaluate-text": text})["text"]["success"]) == ["base", "sft", "dpo", "rl"]  # Prefect's too


def test_nethack_curves_compared_at_matched_steps_and_the_labellers_cost():
    rows = [{"variant": "a", "env_steps": 0, "return": 0.0}, {"variant": "a", "env_steps": 2000, "return": 4.0},
            {"variant": "a", "env_steps": 4000, "return": 6.0},
            {"variant": "b", "env_steps": 500, "return": 1.0}, {"variant": "b", "env_steps": 2500, "return": 3.0}]
    marks, table = matched_steps(rows)
    assert marks == [1000, 2000, 3000, 4000]  # quarters of the longest curve
    # a budget that is not a round number of quarters: 2,500,608 steps gives 625k, 1.25M, 1.88M, 2.5M (three digits)
    assert matched_steps([{"variant": "a", "env_steps": 2_500_608, "return": 1.0}])[0] == [
        625_000, 1_250_000, 1_880_000, 2_500_000]
    # a at 1000: halfway from 0 to 4 = 2; at 3000: halfway from 4 to 6 = 5. b at 1000: 1 + (3-1)·500/2000 = 1.5,
    # at 2000: 1 + 2·1500/2000 = 2.5; b never reached 3000 or 4000
    assert table == [["a", "2", "4", "5", "6"], ["b", "1.5", "2.5", "", ""]]
    assert matched_steps([]) is None
    metrics = {"oni_ranking/oni_labels": 120, "oni_ranking/oni_pending": 7, "oni_ranking/oni_labels_per_s": 3.5,
               "oni_ranking/oni_helpful_share": 0.25, "oni_ranking/oni_heldout_accuracy": 0.9,
               "oni_ranking/oni_llm_sent": 0, "oni_ranking/oni_cpu_s": 41.5, "motif/env_steps": 5}
    assert labeller_rows(metrics) == [["oni_ranking", 120, 7, 3.5, 0.25, 0.9, 0, "", 41.5, ""]]


def test_report_renders_offline_in_headless_chromium(tmp_path):
    project = make_project(tmp_path, ["tracking.enabled=false"])
    stages = project / "metrics" / "stages"
    plots = project / "metrics" / "plots"
    stages.mkdir(parents=True)
    plots.mkdir()
    (stages / "evaluate-text.json").write_text(json.dumps(EVAL_TEXT))
    (stages / "evaluate-nethack.json").write_text(json.dumps(EVAL_NETHACK))
    (stages / "train-dpo.json").write_text(json.dumps({"dpo/pairs_scored": 40, "dpo/mean_implicit_margin": 0.375,
                                                       "dpo/implicit_accuracy": 0.75}))
    (plots / "sft_loss.json").write_text(json.dumps([{"step": i, "loss": 3 / (i + 1)} for i in range(20)]))
    (plots / "rl-nethack.json").write_text(json.dumps(
        [{"variant": v, "env_steps": 100 * i, "return": k * i} for k, v in enumerate(["motif", "extrinsic"])
         for i in range(10)]))

    res = curio(["report"], cwd=project)
    page = Path(res.stdout.strip())
    assert page == project / "data" / "report.html"
    assert json.loads((project / "metrics" / "text_success.json").read_text()) == {"text": {"base": 0.25, "sft": 0.5}}
    assert json.loads((project / "metrics" / "nethack_return.json").read_text()) == \
        {"nethack": {"random": -1.5, "motif": 2.0}}
    html = page.read_text()
    # Self-contained: no script, stylesheet or image fetched from anywhere.
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert html.count("<svg") == 4  # eval bars, NetHack bars, two learning curves
    assert "<td>environment</td>" in html  # the LLM ledger
    assert "<td>0.0625</td>" in html  # base's binomial standard error, sqrt(.25 * .75 / 48)
    assert "<h2>Text track: the DPO policy on its pairs</h2>" in html  # train-dpo's implicit reward margins
    assert "<tr><td>40</td><td>0.375</td><td>0.75</td></tr>" in html

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium missing: `make test` installs it (Debian package `chromium`)"
    shot = tmp_path / "report.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={shot}", "--window-size=1200,1600", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape == (1600, 1200)
    assert pixels.std() > 20  # a blank page has none; text, tables and plots give plenty
    assert (pixels < 128).mean() > 0.01  # dark ink (text, axes, bars) on at least 1 % of the page


def test_dvc_yaml_plots_point_at_files_stages_write():
    """Every data file of the top-level plots is an output of some stage (a renamed file breaks the report)."""
    import yaml

    from pipeline.reporting.report import plot_definitions

    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())
    outs = {next(iter(o)) if isinstance(o, dict) else o for s in spec["stages"].values() for o in s.get("outs", [])}
    for d in plot_definitions(REPO / "dvc.yaml"):
        assert d["file"] in outs, d


def test_dataset_cards_explain_every_column(tmp_path):
    """A README.md next to each dataset a stage writes; every column of the text episodes is documented."""
    from pipeline.core.cards import COLUMNS, write_cards
    from pipeline.core.runners import run_chunked
    from pipeline.text.play import EPISODE_SCHEMA

    out = tmp_path / "rollout_text"
    row = {f.name: None for f in EPISODE_SCHEMA}
    run_chunked(out, num_chunks=2, make_chunk=lambda i: [row], params_hash="h", upstream={"bootstrap": "u"},
                schema=EPISODE_SCHEMA)
    [card] = write_cards([out], "rollout-text")
    text = card.read_text()
    assert card == out / "README.md" and "stage `rollout-text`: 2 rows in 2 Parquet parts" in text
    for f in EPISODE_SCHEMA:
        assert f"| `{f.name}` | " in text and f" | {COLUMNS[f.name]} |" in text
    assert "plain-text JSON" in text and "LOWER is better" in text  # secret; score vs reward


def test_report_runs_after_every_stage_in_the_prefect_pipeline():
    """The report depends on the metrics/stages directory every stage writes into: last in dag order."""
    from pipeline.core.dag import dag_order
    from pipeline.core.stage import STAGES

    order = dag_order(REPO / "dvc.yaml")
    assert order[0] == "check-params" and order[-1] == "report" and set(order[1:-1]) == set(STAGES)
