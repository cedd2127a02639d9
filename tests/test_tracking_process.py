"""A stage's MLflow calls run in its tracking process (python -m pipeline.core.tracking): the stage process never
imports MLflow, the calls arrive in order, and the run ends FINISHED, FAILED or KILLED as the stage did."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipeline.core.tracking import START_WAIT_S, TrackingError, stage_run


def _client(store: Path):
    from mlflow import MlflowClient

    return MlflowClient(f"sqlite:///{store}")


def _runs(store: Path, experiment: str) -> list:
    client = _client(store)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id])


def _statuses(store: Path) -> list[str]:
    """The runs' statuses, read with sqlite3: an MlflowClient would race the store's creation."""
    with contextlib.suppress(sqlite3.OperationalError), contextlib.closing(sqlite3.connect(store)) as db:
        return [row[0] for row in db.execute("SELECT status FROM runs")]
    return []


LOGGING = textwrap.dedent("""
    import sys
    from pathlib import Path
    from pipeline.core.tracking import stage_run

    model = Path("model"); model.mkdir(); (model / "weights.bin").write_bytes(b"w")
    with stage_run("probe", {"a": {"b": 1}, "api_key": "SECRET"}, experiment="probe",
                   tags={"curio.params_hash": "h"}) as tracker:
        assert tracker.enabled
        tracker.log_metrics({"loss/train": 1.5, "note": "not a number"}, step=0)
        tracker.log_metrics({"loss/train": 2.5}, step=1)
        tracker.log_text("hello", "notes/hi.txt")
        tracker.log_artifact(model, "models/model")
        tracker.log_artifact("absent.json")  # nothing to log
        tracker.set_tags({"k": "v"})
        tracker.log_inputs({"data/foo": "ab" * 32})
    print("mlflow imported:", "mlflow" in sys.modules)
""")


@pytest.mark.parametrize("process", ["1", "0"])
def test_calls_reach_the_run_in_order_and_the_stage_process_never_imports_mlflow(tmp_path, process):
    """The same run whether the calls go to the tracking process (the default) or are made in the stage process
    ($CURIO_TRACKING_PROCESS=0); only the latter imports MLflow."""
    store = tmp_path / "mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store}", "CURIO_TRACKING_PROCESS": process}
    res = subprocess.run([sys.executable, "-c", LOGGING], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"mlflow imported: {process == '0'}" in res.stdout  # the default keeps MLflow out of the stage process

    (run,) = _runs(store, "probe")
    assert run.info.status == "FINISHED" and run.info.run_name == "probe"
    assert run.data.params == {"a.b": "1"}  # flattened, the secret left out
    assert run.data.tags["k"] == "v" and run.data.tags["curio.stage"] == "probe"
    assert run.data.tags["curio.params_hash"] == "h" and run.data.tags["mlflow.source.name"] == "-c"
    history = _client(store).get_metric_history(run.info.run_id, "loss_train")
    assert [(m.step, m.value) for m in history] == [(0, 1.5), (1, 2.5)]
    assert "note" not in run.data.metrics
    arts = {a.path for a in _client(store).list_artifacts(run.info.run_id, "models/model")}
    assert arts == {"models/model/weights.bin"}
    assert (tmp_path / "mlartifacts").is_dir()  # artifacts beside the store, in the checkout that ran it
    text = _client(store).download_artifacts(run.info.run_id, "notes/hi.txt", str(tmp_path / "dl"))
    assert Path(text).read_text() == "hello"
    assert [(i.dataset.name, i.dataset.digest) for i in run.inputs.dataset_inputs] == [("data/foo", "ab" * 16)]


@pytest.mark.parametrize("process", ["1", "0"])
def test_a_stage_that_raises_ends_its_run_failed(tmp_path, monkeypatch, process):
    monkeypatch.setenv("CURIO_TRACKING_PROCESS", process)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="boom"), stage_run("probe", {}, experiment="failing") as tracker:
        tracker.log_metrics({"x": 1.0})
        raise ValueError("boom")
    (run,) = _runs(tmp_path / "mlflow.db", "failing")
    assert run.info.status == "FAILED" and run.data.metrics == {"x": 1.0}


def test_a_killed_stage_process_leaves_its_run_killed_not_running(tmp_path):
    store = tmp_path / "mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store}"}
    script = ("import time\nfrom pipeline.core.tracking import stage_run\n"
              "with stage_run('probe', {}, experiment='killed') as t:\n"
              "    t.log_metrics({'x': 1.0})\n    print('working', flush=True)\n    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "working"

    deadline = time.time() + 120
    while time.time() < deadline and _statuses(store) != ["RUNNING"]:
        time.sleep(0.5)  # the tracking process has opened the run
    proc.kill()  # SIGKILL: the stage process gets no chance to end its run
    proc.wait()
    while time.time() < deadline and _statuses(store) == ["RUNNING"]:
        time.sleep(0.5)
    (run,) = _runs(store, "killed")
    assert run.info.status == "KILLED" and run.data.metrics == {"x": 1.0}


def test_a_tracking_store_that_cannot_open_fails_the_stage(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(TrackingError, match="MLflow tracking failed"), \
            stage_run("probe", {}, uri=f"sqlite:///{tmp_path / 'file' / 'mlflow.db'}") as tracker:
        tracker.log_metrics({"x": 1.0})


def test_a_stopped_stage_ends_its_run_killed_without_waiting_for_the_calls_queued(tmp_path, monkeypatch):
    """SIGTERM = checkpoint now: the stage's grace period is not spent logging a model it had queued (seconds of
    MLflow's transformers flavour); its tracking process drops that call and ends the run KILLED."""
    from pipeline.core.interrupt import Stopped
    from pipeline.models import tiny

    store = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    monkeypatch.chdir(tmp_path)
    tokenizer = tiny.train_tokenizer(["guess the word", "is it an animal?"] * 20, 200)
    tiny.save(tiny.build_model(tokenizer, 1, 16, 2, 64), tokenizer, tmp_path / "sft")

    with pytest.raises(Stopped), stage_run("train-sft", {}, experiment="stopped") as tracker:
        tracker.log_metrics({"x": 1.0})
        deadline = time.time() + 120
        while time.time() < deadline and _statuses(store) != ["RUNNING"]:
            time.sleep(0.2)  # the run is open: what follows is queued behind it
        tracker.log_model(tmp_path / "sft", "train-sft", "stopped")
        raise Stopped("stopped by SIGTERM")
    (run,) = _runs(store, "stopped")
    assert run.info.status == "KILLED"
    assert _client(store).search_registered_models() == []  # the queued model was dropped, not logged


def test_a_stage_stopped_while_its_tracking_process_sets_up_mlflow_still_has_its_run_killed(tmp_path, monkeypatch):
    """A stage stopped in its first moment (its tracking process still importing MLflow, ~4 s): the stop waits for
    the set-up and the run's start, so the run is in the store, KILLED with its params, instead of missing (a CI
    run's rollout stopped after its first chunk had no run at all)."""
    from pipeline.core.interrupt import Stopped

    store = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    with pytest.raises(Stopped), stage_run("rollout-text", {"chunk": 7}, experiment="early") as tracker:
        tracker.log_metrics({"x": 1.0})
        raised = time.monotonic() - started
        raise Stopped("stopped by SIGTERM")
    assert raised < 2  # before MLflow (~4 s to import and open its store) could have loaded in the tracking process
    (run,) = _runs(store, "early")
    assert run.info.status == "KILLED" and run.data.params == {"chunk": "7"}
    assert time.monotonic() - started < START_WAIT_S + 5


SWALLOWING = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    from pipeline.core import tracking

    class Calls:  # a call during which the first exception lands in a weakref callback, which swallows it
        def __init__(self, mlflow):
            pass

        def slow(self):
            import weakref

            class Probe:
                pass

            def collected(_ref):
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)  # the handler raises here: Python calls sys.unraisablehook and goes on

            probe = Probe()
            ref = weakref.ref(probe, collected)
            del probe
            time.sleep(30)

    tracking.Calls = Calls
    lines = [{"op": "setup", "experiment": "swallowed", "artifact_root": "mlartifacts", "uri": None},
             {"op": "start", "run_name": "probe", "parent": None, "tags": {}, "params": {}},
             {"op": "call", "name": "slow", "args": []}]
    started = time.monotonic()
    code = tracking._serve(json.dumps(m) for m in lines)
    print(code, round(time.monotonic() - started, 1))
""")


def _serve_script(script: str, store: Path) -> subprocess.CompletedProcess:
    """A tracking process (``tracking._serve``) run by ``script`` in a child, its MLflow store at ``store``."""
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-c", script], cwd=store.parent, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store}",
                                            "PYTHONPATH": str(root)})


def test_a_stop_swallowed_by_the_code_it_lands_in_still_ends_the_run_at_once(tmp_path):
    """SIGTERM's exception can land in code that swallows it (a weakref callback, as in MLflow's SQLAlchemy); it is
    raised again until the run is ended KILLED, instead of the call going on for its 30 s, and the swallowed one
    prints nothing (no "Exception ignored" traceback in a stage's log)."""
    store = tmp_path / "mlflow.db"
    res = _serve_script(SWALLOWING, store)
    code, seconds = res.stdout.split()
    assert code == "0" and _statuses(store) == ["KILLED"], res.stderr[-2000:]
    assert float(seconds) < 15  # the MLflow set-up and the run's start, then at most 0.1 s of the call
    assert "Exception ignored" not in res.stderr and "Traceback" not in res.stderr, res.stderr[-2000:]


CONVERTING = textwrap.dedent("""
    import json, logging, os, signal, sqlite3, time
    from pipeline.core import tracking

    class Calls:  # a call that turns the stop into another error, logging one more on its way out
        def __init__(self, mlflow):
            pass

        def slow(self):
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
            except BaseException as stop:
                try:
                    raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
                except Exception:  # as SQLAlchemy does, closing the cursor of the interrupted query
                    logging.getLogger("sqlalchemy.pool").error("Error closing cursor", exc_info=True)
                raise RuntimeError("Error calling __set_name__") from stop  # as pydantic does in an import

    tracking.Calls = Calls
    lines = [{"op": "setup", "experiment": "converted", "artifact_root": "mlartifacts", "uri": None},
             {"op": "start", "run_name": "probe", "parent": None, "tags": {}, "params": {}},
             {"op": "call", "name": "slow", "args": []}]
    print(tracking._serve(json.dumps(m) for m in lines), 0)
""")


def test_a_stop_turned_into_another_error_and_logged_by_the_code_it_lands_in_is_still_a_quiet_stop(tmp_path):
    """The 100-interruption soak: the stop landed in `import mlflow` (pydantic wrapped it in a RuntimeError, and the
    tracking process reported "MLflow tracking failed" with a traceback) and in an SQLAlchemy query (which logged
    "Error closing cursor" with one). After a stop, what the interrupted call raises or logs is that stop: the run
    ends KILLED, nothing printed."""
    store = tmp_path / "mlflow.db"
    res = _serve_script(CONVERTING, store)
    code, _seconds = res.stdout.split()
    assert code == "0" and _statuses(store) == ["KILLED"], res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "tracking failed" not in res.stderr, res.stderr[-2000:]
