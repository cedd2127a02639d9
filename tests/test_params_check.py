"""A refused param costs nothing, and params.yaml survives `dvc exp run -S`: real DVC experiments on dvc.yaml's own
check-params, evaluate-text and report stages (scripted policy, evaluate-text's model-directory deps dropped so
nothing upstream has to run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import REPO, make_project
from conftest import run_in_project as _run

from pipeline.generate import generate, render_params_yaml, same_params
from pipeline.params import load_params
from pipeline.params_check import STAMP

SCRIPTED = ["tracking.enabled=false", "policy.backend=scripted", "policy.model=scripted:0.4",
            "games.max_eval_tasks=2", "evaluate_text.policies=[base]", "evaluate_text.trajectories_per_task=1"]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]


def _env(project: Path) -> dict:
    return {**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(project),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def _project(tmp_path: Path) -> Path:
    """A committed DVC project (params.yaml as `curio generate` writes it) after a first `dvc repro`."""
    project = make_project(tmp_path, SCRIPTED)
    (project / "params.yaml").write_text(render_params_yaml(load_params(project / "params.yaml")))
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())
    keep = {name: spec["stages"][name] for name in ("check-params", "evaluate-text", "report")}
    keep["evaluate-text"]["deps"] = [d for d in keep["evaluate-text"]["deps"]
                                     if not d.startswith("data/") or d == STAMP]
    (project / "dvc.yaml").write_text(yaml.safe_dump({"stages": keep, "plots": spec["plots"]}, sort_keys=False))
    (project / ".gitignore").write_text((REPO / ".gitignore").read_text())
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"]):
        _run(cmd, project)
    _run(["dvc", "repro", "-q"], project)
    _run(["git", "add", "-A"], project)
    _run([*GIT, "commit", "-qm", "baseline"], project)
    return project


def _git_status(project: Path) -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=project, capture_output=True, text=True).stdout


def test_a_refused_param_costs_no_outputs_and_params_yaml_survives_an_experiment(tmp_path):
    project = _project(tmp_path)
    assert _git_status(project) == ""
    metrics = (project / "metrics" / "stages" / "evaluate-text.json").read_bytes()

    # evaluate-text reads games.groups: without the check DVC would delete its outputs, then the stage refuse it
    res = subprocess.run(["dvc", "exp", "run", "-S", "games.groups=[twenty_questionz]"], cwd=project,
                         env=_env(project), capture_output=True, text=True, timeout=600)
    assert res.returncode != 0
    refusal = [line for line in (res.stdout + res.stderr).splitlines() if line.startswith("curio:")]
    assert refusal == ["curio: params: games.groups: unknown game group 'twenty_questionz'; nothing was run "
                       "(params.yaml restored)"], res.stdout + res.stderr
    assert "Running stage 'evaluate-text'" not in res.stdout
    assert _git_status(project) == ""  # params.yaml given back; the metrics files DVC would have deleted are there
    assert (project / "metrics" / "stages" / "evaluate-text.json").read_bytes() == metrics
    assert json.loads(_run(["dvc", "status", "--json"], project)) == {}

    # A param evaluate-text does not read: the check reruns, its stamp is the same bytes, evaluate-text is skipped
    out = _run(["dvc", "exp", "run", "-S", "bootstrap.epochs=2"], project)
    assert "Running stage 'check-params'" in out and "Stage 'evaluate-text' didn't change, skipping" in out

    # One it reads: it reruns; DVC rewrites params.yaml (blank nulls, block lists) and `curio generate --check`
    # still holds it current, as it would the experiment's commit
    _run(["dvc", "exp", "run", "-S", "games.max_eval_tasks=3"], project)
    text = (project / "params.yaml").read_text()
    assert yaml.safe_load(text)["games"]["max_eval_tasks"] == 3
    rendered = render_params_yaml(load_params(project / "params.yaml"))
    assert text != rendered and same_params(text, rendered)
    assert project / "params.yaml" not in generate(project, check=True)
    # ... and still flags real drift: a help comment or a key that is not the schema's
    for drift in (text.replace("# cap on held-out tasks per group", "# cap"),
                  text.replace("  max_eval_tasks: 3", "  max_eval_tasks: 3\n  max_eval_taskz: 3")):
        (project / "params.yaml").write_text(drift)
        assert project / "params.yaml" in generate(project, check=True)
