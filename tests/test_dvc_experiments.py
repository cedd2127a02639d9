"""DVC experiments compare: metrics are git-tracked (metrics/), so `dvc exp show` has them for the baseline commit
and for each experiment. Real `dvc exp run -S` on dvc.yaml's own evaluate-text and report stages (scripted policy,
its model-directory deps dropped so nothing upstream has to run)."""

from __future__ import annotations

import json
import subprocess

import yaml
from conftest import REPO, make_project
from conftest import run_in_project as _run

SCRIPTED = ["tracking.enabled=false", "policy.backend=scripted", "policy.model=scripted:0.4",
            "games.max_eval_tasks=2", "evaluate_text.policies=[base]", "evaluate_text.trajectories_per_task=1"]




def _metrics(exp: dict) -> dict:
    """{path: values} of one `dvc exp show --json` row."""
    return {path: m["data"] for path, m in (exp["data"].get("metrics") or {}).items()}


def test_exp_show_has_the_metrics_of_baseline_and_experiment(tmp_path):
    project = make_project(tmp_path, SCRIPTED)
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())
    check, evaluate, report = (spec["stages"][n] for n in ("check-params", "evaluate-text", "report"))
    evaluate["deps"] = [d for d in evaluate["deps"] if not d.startswith("data/") or d == "data/params.ok"]
    (project / "dvc.yaml").write_text(yaml.safe_dump(
        {"stages": {"check-params": check, "evaluate-text": evaluate, "report": report}, "plots": spec["plots"]},
        sort_keys=False))
    (project / ".gitignore").write_text((REPO / ".gitignore").read_text())
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"]):
        _run(cmd, project)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    _run(["dvc", "repro", "-q"], project)
    _run(["git", "add", "-A"], project)
    _run([*git, "commit", "-qm", "baseline"], project)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=project, capture_output=True, text=True).stdout
    assert status == ""  # dvc.lock, metrics/ and plots are all in the commit: nothing generated is left untracked

    _run(["dvc", "exp", "run", "-q", "-n", "more-tasks", "-S", "games.max_eval_tasks=4"], project)
    rows = json.loads(_run(["dvc", "exp", "show", "--json"], project))
    baseline = next(r for r in rows if r["rev"] != "workspace")
    exps = [e for r in rows for exp in (r.get("experiments") or []) for e in exp["revs"]]
    named = next(e for e in exps if e.get("name") == "more-tasks")
    for row, episodes in ((baseline, 2), (named, 4)):
        metrics = _metrics(row)
        assert set(metrics) == {"metrics/text_success.json", "metrics/nethack_return.json"}  # summaries only
        assert 0.0 <= metrics["metrics/text_success.json"]["text"]["base"] <= 1.0  # a column `text.base`
        assert row["data"]["params"]["params.yaml"]["data"]["games"]["max_eval_tasks"] == episodes
    # The per-stage details travel with the experiment too: `dvc exp diff` reads them from its commit.
    diff = json.loads(_run(["dvc", "exp", "diff", "--json", "--all", "HEAD", "more-tasks"], project))
    assert diff["params"]["params.yaml"]["games.max_eval_tasks"] == {"old": 2, "new": 4, "diff": 2}
    details = json.loads(_run(["git", "show", f"{named['rev']}:metrics/stages/evaluate-text.json"], project))
    assert details["base/episodes"] == 4
