"""Under a pipeline run, the pipeline's process serves its stages' MLflow calls (pipeline.core.tracking's
TrackingService): a stage starts no tracking process, and its run ends FINISHED, FAILED or KILLED as the stage did,
with the same calls in the same order as its own tracking process would make."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipeline.core.tracking import SOCKET_ENV, TrackingError, pipeline_run, stage_run

STAGE = textwrap.dedent("""
    import sys
    from pathlib import Path
    from pipeline.core.tracking import StageTracking

    model = Path("model"); model.mkdir(); (model / "weights.bin").write_bytes(b"w")
    with StageTracking("probe") as tracking, tracking.run("probe", {"a": {"b": 1}, "api_key": "SECRET"},
                                                         tags={"curio.params_hash": "h"}) as tracker:
        print("service:", tracking.conn is not None, "process:", tracking.proc is not None, flush=True)
        tracker.log_metrics({"loss/train": 1.5}, step=0)
        tracker.log_metrics({"loss/train": 2.5}, step=1)
        tracker.log_text("hello", "notes/hi.txt")
        tracker.log_artifact(model, "models/model")
        tracker.set_tags({"k": "v"})
        tracker.log_inputs({"data/foo": "ab" * 32})
    print("mlflow imported:", "mlflow" in sys.modules)
""")


def _client(store: Path):
    from mlflow import MlflowClient

    return MlflowClient(f"sqlite:///{store}")


def _stage_runs(store: Path) -> list:
    client = _client(store)
    exp = client.get_experiment_by_name("probe")
    return [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("curio.kind") != "pipeline"]


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("CURIO_TRACKING_PROCESS", raising=False)
    return tmp_path


def test_a_stage_under_a_pipeline_run_logs_through_its_service_in_order(project):
    with pipeline_run("pipeline", experiment="probe") as parent:
        socket_path = Path(os.environ[SOCKET_ENV])
        res = subprocess.run([sys.executable, "-c", STAGE], cwd=project, env=dict(os.environ), capture_output=True,
                             text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "service: True process: False" in res.stdout and "mlflow imported: False" in res.stdout
    assert SOCKET_ENV not in os.environ  # the pipeline's env is as it was
    assert not socket_path.parent.exists()  # and its socket is gone with it

    store = project / "mlflow.db"
    (run,) = _stage_runs(store)
    assert run.info.status == "FINISHED" and run.info.run_name == "probe"
    assert run.data.tags["mlflow.parentRunId"] == parent  # nested under the pipeline run
    assert run.data.params == {"a.b": "1"} and run.data.tags["k"] == "v"
    assert run.data.tags["curio.params_hash"] == "h" and run.data.tags["mlflow.source.name"] == "-c"
    history = _client(store).get_metric_history(run.info.run_id, "loss_train")
    assert [(m.step, m.value) for m in history] == [(0, 1.5), (1, 2.5)]
    arts = {a.path for a in _client(store).list_artifacts(run.info.run_id, "models/model")}
    assert arts == {"models/model/weights.bin"} and (project / "mlartifacts").is_dir()
    text = _client(store).download_artifacts(run.info.run_id, "notes/hi.txt", str(project / "dl"))
    assert Path(text).read_text() == "hello"
    assert [(i.dataset.name, i.dataset.digest) for i in run.inputs.dataset_inputs] == [("data/foo", "ab" * 16)]


def test_a_stage_with_other_tracking_settings_starts_its_own_process(project):
    script = STAGE.replace('StageTracking("probe")', 'StageTracking("elsewhere")')
    with pipeline_run("pipeline", experiment="probe"):
        res = subprocess.run([sys.executable, "-c", script], cwd=project, env=dict(os.environ), capture_output=True,
                             text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "service: False process: True" in res.stdout
    client = _client(project / "mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("elsewhere").experiment_id])
    assert run.info.status == "FINISHED"


def test_a_stage_that_raises_or_whose_call_fails_ends_its_run_failed(project, capsys):
    with pipeline_run("pipeline", experiment="probe"):
        with pytest.raises(ValueError, match="boom"), stage_run("raises", {}, experiment="probe") as tracker:
            tracker.log_metrics({"x": 1.0})
            raise ValueError("boom")
        # a call MLflow refuses (a tag key over its 250 characters): one line from the stage, its run FAILED
        with pytest.raises(TrackingError, match="MLflow tracking failed"), \
                stage_run("refused", {}, experiment="probe") as tracker:
            tracker.set_tags({"k" * 300: "v"})
    assert "curio: MLflow tracking failed: MlflowException" in capsys.readouterr().err
    runs = {r.info.run_name: r for r in _stage_runs(project / "mlflow.db")}
    assert runs["raises"].info.status == "FAILED" and runs["raises"].data.metrics == {"x": 1.0}
    assert runs["refused"].info.status == "FAILED"


def test_a_killed_stage_process_leaves_its_run_killed_not_running(project):
    script = ("import time\nfrom pipeline.core.tracking import stage_run\n"
              "with stage_run('probe', {}, experiment='probe') as t:\n"
              "    t.log_metrics({'x': 1.0})\n    print('working', flush=True)\n    time.sleep(600)\n")
    with pipeline_run("pipeline", experiment="probe"):
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=project, env=dict(os.environ),
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "working"
        deadline = time.time() + 60
        while time.time() < deadline and not [r for r in _stage_runs(project / "mlflow.db") if r.data.metrics]:
            time.sleep(0.2)  # the service has opened the run and logged x
        proc.kill()  # SIGKILL: the stage process gets no chance to end its run
        proc.wait()
    (run,) = _stage_runs(project / "mlflow.db")  # the pipeline run ended once its service had ended the stage's
    assert run.info.status == "KILLED" and run.data.metrics == {"x": 1.0}


def test_a_stopped_stage_ends_its_run_killed_without_waiting_for_the_calls_queued(project):
    from pipeline.core.interrupt import Stopped
    from pipeline.models import tiny

    tokenizer = tiny.train_tokenizer(["guess the word", "is it an animal?"] * 20, 200)
    tiny.save(tiny.build_model(tokenizer, 1, 16, 2, 64), tokenizer, project / "sft")
    with pipeline_run("pipeline", experiment="probe"):
        started = time.monotonic()
        with pytest.raises(Stopped), stage_run("train-sft", {}, experiment="probe") as tracker:
            tracker.log_metrics({"x": 1.0})
            tracker.log_model(project / "sft", "train-sft", "probe")  # seconds of MLflow's transformers flavour
            tracker.log_model(project / "sft", "train-sft", "probe")
            raise Stopped("stopped by SIGTERM")
        stopped_after = time.monotonic() - started
    (run,) = _stage_runs(project / "mlflow.db")
    assert run.info.status == "KILLED"
    # the stage did not wait for its queued calls; at most the one in flight when it stopped was carried out
    assert stopped_after < 2
    assert len(_client(project / "mlflow.db").search_model_versions("name='probe-train-sft'")) <= 1
