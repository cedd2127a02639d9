"""Artifacts off the machine: a whole run pushed to a DVC remote and pulled into a fresh clone (where `dvc repro`
then has nothing to do), and stage runs logged to an `mlflow server` on 127.0.0.1 instead of the file store.

The DVC run is dvc.yaml's own rollout-text → annotate-text → evaluate-text → report with the scripted policy (its
model-directory deps dropped so nothing upstream has to run): a few seconds a stage.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import REPO, curio, make_project
from conftest import run_in_project as _run

from pipeline.core.artifacts import dataset_hash

SCRIPTED = ["tracking.enabled=false", "policy.backend=scripted", "policy.model=scripted:0.4",
            "games.max_train_tasks=4", "games.max_eval_tasks=2", "rollout_text.trajectories_per_task=1",
            "evaluate_text.policies=[base]", "evaluate_text.trajectories_per_task=1"]
STAGES = ["rollout-text", "annotate-text", "evaluate-text", "report"]




@pytest.mark.slow  # four stages and a dozen dvc commands: ~20 CPU-seconds, minutes on a shared machine
def test_a_run_pushed_to_a_dvc_remote_is_pulled_by_a_fresh_clone_and_repro_is_a_no_op(tmp_path):
    project = make_project(tmp_path, SCRIPTED)
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())
    stages = {name: spec["stages"][name] for name in STAGES}
    for name in ("rollout-text", "evaluate-text"):  # the scripted player needs no model directory
        stages[name]["deps"] = [d for d in stages[name]["deps"]
                                if not d.startswith(("data/bootstrap", "data/train_policy", "data/rl_text"))]
    (project / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages, "plots": spec["plots"]}, sort_keys=False))
    (project / ".gitignore").write_text((REPO / ".gitignore").read_text())
    remote = tmp_path / "remote"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"],
                ["dvc", "repro", "-q"], ["dvc", "remote", "add", "-d", "store", str(remote)], ["dvc", "push", "-q"],
                ["git", "add", "-A"], [*git, "commit", "-qm", "a run"]):
        _run(cmd, project)
    assert any(remote.rglob("*")), "dvc push stored nothing"

    clone = tmp_path / "clone"
    _run(["git", "clone", "-q", str(project), str(clone)], tmp_path)
    assert not (clone / "data" / "rollout_text").exists()  # data/ is DVC's, not git's
    _run(["dvc", "pull", "-q"], clone)
    for out in ("rollout_text", "annotate_text", "evaluate_text"):
        assert dataset_hash(clone / "data" / out) == dataset_hash(project / "data" / out)
    assert "Data and pipelines are up to date" in _run(["dvc", "status"], clone)
    repro = _run(["dvc", "repro"], clone)
    assert "Running stage" not in repro and all(f"Stage '{s}' didn't change" in repro for s in STAGES), repro


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, server: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert server.poll() is None, "mlflow server exited"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError("mlflow server not healthy")


@pytest.mark.slow  # an mlflow server (~18 s to start) and two stage runs
def test_stages_log_to_an_mlflow_tracking_server_by_param_or_env(tmp_path):
    from mlflow.tracking import MlflowClient

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    store = tmp_path / "server"
    store.mkdir()
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - closed when the server is stopped below
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}", "--artifacts-destination", str(store / "art"),
         "--workers", "1"], cwd=store, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_healthy(url, server)
        work = tmp_path / "work"
        work.mkdir()
        common = [*SCRIPTED[1:], "tracking.enabled=true", "tracking.experiment=served", f"data_dir={work / 'data'}"]
        # The param wins over $MLFLOW_TRACKING_URI (conftest's curio() points it at a local SQLite file).
        sets = [arg for o in common for arg in ("-S", o)]
        curio(["stage", "evaluate-text", "-p", str(REPO / "params.yaml"), *sets, "-S", f"tracking.uri={url}"], work)
        assert not (work / "mlflow.db").exists() and not (work / "mlartifacts").exists()
        # No param: the environment names the server.
        env_run = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", "stage", "evaluate-text", "-p", str(REPO / "params.yaml"), *sets],
            cwd=work, capture_output=True, text=True, timeout=300,
            env={**os.environ, "TQDM_DISABLE": "1", "MLFLOW_TRACKING_URI": url})
        assert env_run.returncode == 0, env_run.stderr[-3000:]

        client = MlflowClient(tracking_uri=url)
        experiment = client.get_experiment_by_name("served")
        runs = client.search_runs([experiment.experiment_id])
        assert [r.info.run_name for r in runs] == ["evaluate-text", "evaluate-text"]
        assert all(0.0 <= r.data.metrics["base_success_rate"] <= 1.0 for r in runs)
        # Artifacts went through the server into its artifact store, and come back from it.
        files = {a.path for a in client.list_artifacts(runs[0].info.run_id)}
        assert "eval.png" in files
        assert any(p.name == "eval.png" for p in (store / "art").rglob("*"))
        local = client.download_artifacts(runs[0].info.run_id, "eval.png", str(tmp_path))
        assert Path(local).stat().st_size > 1000
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()
