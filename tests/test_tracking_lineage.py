"""MLflow: a training experiment, lineage on every stage run (git commit, params hash, input digests via
log_input, output digests), trained models logged through MLflow's flavours with a model card, artifacts inside
the checkout that ran them (also in a copy whose mlflow.db came along)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_project
from test_nethack_stages import TINY

from pipeline.core.artifacts import dataset_hash
from pipeline.core.stage import digest

STAGES = ("rollout-nethack", "annotate-nethack", "pairs-nethack", "train-reward")


def _curio(args: list[str], cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # the checkout's default store
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=cwd, capture_output=True, text=True,
                         env={**env, "TQDM_DISABLE": "1", "PYTHONPATH": str(cwd)}, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


def _client(project: Path):
    from mlflow import MlflowClient

    return MlflowClient(f"sqlite:///{project / 'mlflow.db'}")


@pytest.mark.slow  # four NetHack stages with tracking: ~1-2 min idle, far more on a loaded machine
def test_stage_runs_carry_lineage_and_models(tmp_path):
    project = make_project(tmp_path, [o for o in TINY if o != "tracking.enabled=false"])
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], [*git, "commit", "-qm", "c"]):
        subprocess.run(cmd, cwd=project, check=True, capture_output=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project, capture_output=True, text=True).stdout.strip()
    for name in STAGES:
        _curio(["stage", name], project)

    client = _client(project)
    exp = client.get_experiment_by_name("curio")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert exp.artifact_location == (project / "mlartifacts").resolve().as_uri()
    runs = {r.data.tags["curio.stage"]: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == set(STAGES)
    run = runs["train-reward"]
    assert run.data.tags["mlflow.source.git.commit"] == commit
    assert len(run.data.tags["curio.params_hash"]) == 64
    # Its input: the pairs dataset, by content digest; its output: the reward model.
    inputs = {i.dataset.name: i.dataset.digest for i in run.inputs.dataset_inputs}
    pairs = project / "data" / "pairs_nethack"
    assert inputs == {str(Path("data/pairs_nethack")): dataset_hash(pairs)[:32]}
    lineage = json.loads(Path(client.download_artifacts(run.info.run_id, "lineage.json", str(tmp_path))).read_text())
    assert lineage["git_commit"] == commit and lineage["inputs"] == {"data/pairs_nethack": dataset_hash(pairs)}
    assert lineage["outputs"]["data/reward_model"] == digest(project / "data" / "reward_model")
    # Upstream's output digest is downstream's input digest: the chain is traceable run to run.
    assert runs["pairs-nethack"].data.tags["curio.output.pairs_nethack"] == dataset_hash(pairs)[:16]
    card = client.download_artifacts(run.info.run_id, "models/reward_model/MODEL_CARD.md", str(tmp_path))
    text = Path(card).read_text()
    assert commit in text and "val_agreement" in text and "data/pairs_nethack" in text
    # The model itself: a pytorch-flavoured MLflow Logged Model of the run, registered as curio-train-reward
    logged = [m for m in client.search_logged_models([exp.experiment_id]) if m.source_run_id == run.info.run_id]
    assert [m.name for m in logged] == ["reward_model"]
    assert [v.run_id for v in client.search_model_versions("name='curio-train-reward'")] == [run.info.run_id]
    assert str(project / "mlartifacts") in run.info.artifact_uri

    # A copied checkout (mlflow.db included) logs into its own mlartifacts, never into the original's.
    copy = tmp_path / "copy"
    shutil.copytree(project, copy, symlinks=True)
    _curio(["stage", "pairs-nethack"], copy)
    latest = _client(copy).search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])[0]
    assert latest.info.artifact_uri.startswith((copy / "mlartifacts").resolve().as_uri())
