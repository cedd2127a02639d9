"""MLflow: one run per stage, nested under a pipeline run; params, metrics, artifacts, lineage tags.

The default store is a SQLite file under the repo (git-ignored); ``MLFLOW_TRACKING_URI`` overrides it, and
``tracking.uri`` in params overrides both (e.g. an ``mlflow server``: ``http://HOST:5000``). Artifacts go
to ``tracking.artifact_root`` (default ``mlartifacts``, resolved against the checkout the command runs in): a
copied checkout, even one whose ``mlflow.db`` came along, writes into its own directory, never the original's.
The experiment is tagged as a model-training experiment (``mlflow.experimentKind``), so the UI opens its runs
view, not the GenAI one. Each stage run carries its lineage (``record_lineage``).
A pipeline run (``curio pipeline`` / the Prefect ``pipeline`` flow) exports ``CURIO_PARENT_RUN_ID`` so the
stage runs started by ``dvc repro`` or by the flow nest under it.

A stage's MLflow calls run in a child process (``python -m pipeline.core.tracking``) started before the stage imports
its own libraries: importing MLflow and opening its store (~4 s) then happens on the other core, while the stage
loads torch and its model, instead of before them. The stage process sends each call down a pipe (fire and
forget, in order) and waits for the child when the run ends, so the run is complete when the stage returns. A
stage process that dies leaves its run ``KILLED`` (the child reads end-of-input), never ``RUNNING``; one stopped by a
signal (:mod:`pipeline.core.interrupt`) ends it ``KILLED`` at once, dropping the calls not yet carried out. A stop
that lands while the child still sets MLflow up waits for the set-up and the run's start (seconds, at most
``START_WAIT_S``), so a stage stopped in its first moments still has its run, ``KILLED``.

Under a pipeline run (``make run``, ``curio pipeline``, the Prefect ``pipeline`` flow) the pipeline's own process has
MLflow loaded and its store open already: it serves its stages' calls on a Unix socket (:class:`TrackingService`,
``$CURIO_TRACKING_SOCKET``), one thread per stage run, so a stage starts no tracking process and loads nothing of
MLflow. The messages, their order and how a run ends are the same; a stage whose tracking settings differ from the
pipeline's starts its own process as above.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipeline.core.errors import CurioError, DiskFull, disk_full
from pipeline.core.interrupt import SIGNALS, Stopped
from pipeline.core.mlflow_models import log_model

PARENT_ENV = "CURIO_PARENT_RUN_ID"
# The tag MLflow 3's UI reads to pick an experiment's view; this value is its "model training" kind.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
_SECRET_HINTS = ("key", "token", "secret", "password")


def tracking_uri(root: Path | None = None, uri: str | None = None) -> str:
    """``uri`` (params' ``tracking.uri``), else ``$MLFLOW_TRACKING_URI``, else this checkout's SQLite store."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    root = (root or Path.cwd()).resolve()
    return f"sqlite:///{root / 'mlflow.db'}"


def _setup(experiment: str, artifact_root: str = "mlartifacts", uri: str | None = None) -> Any:
    logging.getLogger("alembic").setLevel(logging.WARNING)
    import mlflow

    own_store = not uri and "MLFLOW_TRACKING_URI" not in os.environ  # read first: set_tracking_uri exports it
    uri = tracking_uri(uri=uri)
    mlflow.set_tracking_uri(uri)
    # SQLite stores keep artifacts in this checkout; remote servers choose their own artifact root.
    root = (Path.cwd() / artifact_root).resolve().as_uri() if uri.startswith("sqlite") else None
    if mlflow.get_experiment_by_name(experiment) is None:
        with contextlib.suppress(Exception):  # created concurrently by another stage
            mlflow.create_experiment(experiment, artifact_location=root)
    exp = mlflow.set_experiment(experiment)
    if root and own_store and exp.artifact_location != root:
        _reroot(uri, exp.experiment_id, exp.artifact_location, root)
    if exp.tags.get(EXPERIMENT_KIND[0]) != EXPERIMENT_KIND[1]:
        mlflow.set_experiment_tag(*EXPERIMENT_KIND)
    return mlflow


def _reroot(uri: str, experiment_id: str, old: str, new: str) -> None:
    """This checkout's own store (a copied mlflow.db) names another checkout's artifact directory: point the
    experiment's new runs at this one's. MLflow has no API to move an experiment's artifact location."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(uri.removeprefix("sqlite:///"))) as db, db:
        db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?", (new, int(experiment_id)))
    logging.getLogger(__name__).warning("mlflow: experiment %s stored artifacts in %s; new runs use %s",
                                        experiment_id, old, new)


def flatten_params(d: dict, prefix: str = "") -> dict[str, str]:
    """Flatten nested params to dotted keys; values that look like secrets are never logged."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_params(v, key + "."))
        elif any(h in k.lower() for h in _SECRET_HINTS) and not k.lower().endswith("_env"):
            continue
        else:
            out[key] = str(v)[:500]
    return out


class Calls:
    """The MLflow calls behind a :class:`Tracker`, made where MLflow is imported (the tracking process)."""

    def __init__(self, mlflow: Any) -> None:
        self.mlflow = mlflow

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.mlflow.log_metrics(metrics, step=step)

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        if Path(path).is_dir():
            self.mlflow.log_artifacts(path, artifact_path=artifact_path or Path(path).name)
        else:
            self.mlflow.log_artifact(path, artifact_path=artifact_path)

    def set_tags(self, tags: dict[str, str]) -> None:
        self.mlflow.set_tags(tags)

    def log_inputs(self, digests: dict[str, str], context: str) -> None:
        """Datasets (or models) a stage read, as MLflow dataset inputs: name = path, digest = content hash."""
        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.meta_dataset import MetaDataset

        for path, digest in digests.items():
            with warnings.catch_warnings():  # "can be interpreted in multiple ways": both are the local source
                warnings.simplefilter("ignore", UserWarning)
                source = resolve_dataset_source(str(Path(path).resolve()))
            self.mlflow.log_input(MetaDataset(source, name=path, digest=digest[:32]), context=context)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.mlflow.log_text(text, artifact_file)

    def log_table(self, data: dict[str, list], artifact_file: str) -> None:
        self.mlflow.log_table(data=data, artifact_file=artifact_file)

    def log_model(self, path: str, stage: str, experiment: str, loader: str | None = None) -> None:
        log_model(self.mlflow, path, stage, experiment, loader)


class Tracker:
    """What a stage sees: log metrics/artifacts; a no-op when tracking is disabled. ``send(name, args)`` makes
    the :class:`Calls` call ``name`` (in the tracking process, or in this one)."""

    def __init__(self, send: Callable[[str, list], None] | None = None) -> None:
        self._send = send

    @property
    def enabled(self) -> bool:
        return self._send is not None

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self._send is None:
            return
        # MLflow's names take [\w.\- :] only: a tiered group's "@", "," and "=" become ":" (GAME:TIER)
        clean = {re.sub(r"[^\w.\- :]", ":", k.replace("/", "_")): float(v) for k, v in metrics.items()
                 if isinstance(v, int | float)}
        if clean:
            self._send("log_metrics", [clean, step])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if self._send is not None and path.exists():
            self._send("log_artifact", [os.path.abspath(path), artifact_path])

    def set_tags(self, tags: dict[str, str]) -> None:
        if self._send is not None:
            self._send("set_tags", [tags])

    def log_inputs(self, digests: dict[str, str], context: str = "input") -> None:
        """Datasets (or models) a stage read, as MLflow dataset inputs: name = path, digest = content hash."""
        if self._send is not None and digests:
            self._send("log_inputs", [digests, context])

    def log_text(self, text: str, artifact_file: str) -> None:
        if self._send is not None:
            self._send("log_text", [text, artifact_file])

    def log_table(self, data: dict[str, list], artifact_file: str) -> None:
        """A few rows as an MLflow table artifact (``mlflow.log_table``): columns of JSON-safe values."""
        if self._send is not None and data:
            self._send("log_table", [data, artifact_file])

    def log_model(self, path: str | Path, stage: str, experiment: str, loader: str | None = None) -> None:
        """A trained model through MLflow's flavour for it, registered as ``EXPERIMENT-STAGE``
        (:mod:`pipeline.core.mlflow_models`); ``loader``: see ``Stage.model_loader``."""
        if self._send is not None and Path(path).exists():
            self._send("log_model", [os.path.abspath(path), stage, experiment, loader])


class TrackingError(CurioError):
    """The tracking process failed (its error is on stderr above): a store or server MLflow cannot use."""


#: The tracking process's exit status when MLflow's store or artifact root ran out of space (the stage process then
#: raises :class:`DiskFull`: one line, exit 2).
DISK_FULL_EXIT = 28  # ENOSPC

#: ``CURIO_TRACKING_PROCESS=0``: make a stage's MLflow calls in the stage process itself, as one call after
#: another (what ``bench/bench_tracking.py`` compares with the tracking process).
PROCESS_ENV = "CURIO_TRACKING_PROCESS"
#: A pipeline run's tracking service: its socket, and the set-up it serves (experiment, artifact root, store).
SOCKET_ENV, SERVICE_KEY_ENV = "CURIO_TRACKING_SOCKET", "CURIO_TRACKING_SERVICE_KEY"
#: ``CURIO_TRACKING_SERVICE=0``: a pipeline run serves no calls; each stage starts its own tracking process.
SERVICE_ENV = "CURIO_TRACKING_SERVICE"


def service_key(experiment: str, artifact_root: str, uri: str | None) -> str:
    """What a tracking service must have been set up with to take a stage's calls: the same experiment, artifact
    directory and store, resolved where the command runs."""
    return json.dumps([experiment, str((Path.cwd() / artifact_root).resolve()), tracking_uri(uri=uri)])


def _service_connection(experiment: str, artifact_root: str, uri: str | None) -> socket.socket | None:
    """A connection to the pipeline's tracking service, when one serves this set-up."""
    path = os.environ.get(SOCKET_ENV)
    if not path or os.environ.get(SERVICE_KEY_ENV) != service_key(experiment, artifact_root, uri):
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:  # the pipeline's process is gone: this stage tracks on its own
        conn.close()
        return None
    return conn


class StageTracking:
    """The tracking process of one stage run: started now (MLflow loads in it while the stage imports its own
    libraries); :meth:`run` opens the MLflow run; leaving the ``with`` block waits for it to finish. With
    ``$CURIO_TRACKING_PROCESS=0`` the same messages are handled in this process, synchronously."""

    def __init__(self, experiment: str = "curio", enabled: bool = True, artifact_root: str = "mlartifacts",
                 uri: str | None = None) -> None:
        self.proc: subprocess.Popen | None = None
        self.inline: _Handler | None = None
        self.conn: socket.socket | None = None
        self.started = False
        self._lock = threading.Lock()  # one message per line, whichever thread logs
        if not enabled:
            return
        if os.environ.get(PROCESS_ENV, "1") == "0":
            self.inline = _Handler()
        elif (conn := _service_connection(experiment, artifact_root, uri)) is not None:
            self.conn = conn  # the pipeline's service is set up already: no "setup" message
            return
        else:
            # started with SIGTERM and SIGINT blocked (the mask is inherited): one sent before it has set its
            # handlers (the stage stopped in its first moment) waits for them instead of killing it unrecorded
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
            try:
                self.proc = subprocess.Popen([sys.executable, "-m", "pipeline.core.tracking"],
                                             stdin=subprocess.PIPE, text=True, encoding="utf-8")
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        self._write({"op": "setup", "experiment": experiment, "artifact_root": artifact_root, "uri": uri})

    def __enter__(self) -> StageTracking:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if not self.started:  # no run was opened (the stage failed first): the process just exits
            self.close(None, check=kind is None)

    def _write(self, message: dict) -> None:
        if self.inline is not None:
            with self._lock:
                self.inline(message)
            return
        line = json.dumps(message) + "\n"
        if self.conn is not None:
            with self._lock, contextlib.suppress(OSError):  # the service went away: close() reports it
                self.conn.sendall(line.encode("utf-8"))
            return
        assert self.proc is not None and self.proc.stdin is not None
        with self._lock, contextlib.suppress(BrokenPipeError, OSError):  # it failed: close() reports it
            self.proc.stdin.write(line)
            self.proc.stdin.flush()

    def close(self, status: str | None, check: bool = True) -> None:
        """End the run with ``status`` (None: no run) and wait for the process; raise if it failed."""
        if self.inline is not None:
            handler, self.inline = self.inline, None
            try:
                if status is not None:
                    handler({"op": "end", "status": status})
            except Exception:
                if check:
                    raise
            return
        if self.conn is None and self.proc is None:
            return
        if status is not None:
            self._write({"op": "end", "status": status})
        code = self._wait_for_service(status) if self.conn is not None else self._wait_for_process()
        if code == DISK_FULL_EXIT and check:
            raise DiskFull.at("MLflow's store or artifacts (tracking.uri / tracking.artifact_root)")
        if code != 0 and check:
            raise TrackingError("MLflow tracking failed (its error is above): check tracking.uri or "
                                "MLFLOW_TRACKING_URI and that the store or server is reachable")

    def _wait_for_process(self) -> int:
        """The tracking process's exit status, once it has carried out every call."""
        proc, self.proc = self.proc, None
        assert proc is not None
        with contextlib.suppress(BrokenPipeError, OSError):
            proc.stdin.close()  # type: ignore[union-attr]
        return proc.wait()

    def _wait_for_service(self, status: str | None) -> int:
        """The service's answer once it has carried out every call: 0, or the status the tracking process would
        have exited with (its error printed here, as that process prints it)."""
        conn, self.conn = self.conn, None
        assert conn is not None
        answer: dict = {}
        with conn, contextlib.suppress(OSError, ValueError):
            conn.shutdown(socket.SHUT_WR)
            answer = json.loads(conn.makefile("r", encoding="utf-8").readline() or "{}")
        if answer.get("error"):
            print(f"curio: MLflow tracking failed: {answer['error']}", file=sys.stderr, flush=True)
        return answer.get("code", 1 if status is not None else 0)

    def _abandon_service(self) -> None:
        """Stopping: the service ends the run KILLED after the call in flight, dropping the rest; not waited for."""
        conn, self.conn = self.conn, None
        if conn is not None:
            with conn, contextlib.suppress(OSError):
                conn.sendall(b'{"op": "abort"}\n')

    @contextlib.contextmanager
    def run(self, stage: str, params: dict, tags: dict | None = None) -> Iterator[Tracker]:
        """The stage's MLflow run, nested under ``$CURIO_PARENT_RUN_ID`` when set."""
        if self.proc is None and self.inline is None and self.conn is None:
            yield Tracker(None)
            return
        if self.proc is not None and self.proc.poll() is not None:
            self.close(None)  # MLflow could not start (a bad store or URI): fail before the work
        parent = os.environ.get(PARENT_ENV)
        all_tags = {"curio.stage": stage, "mlflow.source.name": sys.argv[0], **(tags or {})}
        self._write({"op": "start", "run_name": stage, "parent": parent, "tags": all_tags,
                     "params": flatten_params(params)})
        self.started = True
        try:
            yield Tracker(lambda name, args: self._write({"op": "call", "name": name, "args": args}))
        except (KeyboardInterrupt, Stopped):
            if self.proc is not None:  # the calls still queued (a model being logged) are dropped, not waited for
                with contextlib.suppress(OSError):
                    self.proc.send_signal(signal.SIGTERM)
            self._abandon_service()
            self.close("KILLED", check=False)
            raise
        except BaseException:
            self.close("FAILED", check=False)
            raise
        self.close("FINISHED")


class _Handler:
    """Carries out a stage run's messages (the set-up, the run's start, its calls, its end) with MLflow."""

    def __init__(self) -> None:
        self.mlflow: Any = None
        self.calls: Calls | None = None

    def __call__(self, msg: dict) -> bool:
        """Handle one message; True once the run has ended."""
        if msg["op"] == "setup":
            self.mlflow = _setup(msg["experiment"], msg["artifact_root"], msg["uri"])
        elif msg["op"] == "start":
            parent = msg["parent"]
            self.mlflow.start_run(run_name=msg["run_name"], parent_run_id=parent, nested=bool(parent),
                                  tags=msg["tags"])
            self.mlflow.log_params(msg["params"])
            self.calls = Calls(self.mlflow)
        elif msg["op"] == "call":
            getattr(self.calls, msg["name"])(*msg["args"])
        elif msg["op"] == "end":
            self.mlflow.end_run(status=msg["status"])
            return True
        return False

    def abort(self, status: str) -> None:
        # the run, if it was created: also one whose start (its params) was cut short by the stop
        if self.mlflow is not None and self.mlflow.active_run() is not None:
            self.mlflow.end_run(status=status)


class _Abandoned(BaseException):
    """SIGTERM / SIGINT in the tracking process: the stage is stopping (:mod:`pipeline.core.interrupt`)."""


# A stop that lands during MLflow's set-up or the run's start waits this long for them, so the run is recorded (as
# KILLED) rather than lost; a set-up still going after it (a slow remote server) is abandoned. Half the default
# grace period: the stage process waits for this one before it exits.
START_WAIT_S = 10.0


class _Stop:
    ending = False  # the run is being ended: nothing interrupts that
    asked = False  # a stop was asked for: whatever the call in flight raises or logs as it unwinds is that stop
    starting = True  # MLflow is being set up or the run started: a stop waits for that (START_WAIT_S at most)


def _abandon(_signum: int, _frame: object) -> None:
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)  # once is enough
    _Stop.asked = True
    # the code the stop lands in may log it as its own error (SQLAlchemy's "Error closing cursor", with the
    # traceback): the stage process says what happened, in its one line
    logging.disable(logging.CRITICAL)
    if _Stop.starting:  # raised once the run has started (_run), or by the timer if that takes too long
        signal.setitimer(signal.ITIMER_REAL, START_WAIT_S, 0.1)
        return
    _raise_stop()


def _raise_stop() -> None:
    # Raised where the main thread happens to be, the exception can land in code that swallows it (a weakref
    # callback: Python prints "Exception ignored" and goes on with the call): it is raised again every 0.1 s until
    # the run is being ended.
    signal.setitimer(signal.ITIMER_REAL, 0.1, 0.1)
    raise _Abandoned


def _abandon_again(_signum: int, _frame: object) -> None:
    if not _Stop.ending:  # (armed by _abandon only)
        raise _Abandoned


def _unraisable(hook: Callable) -> Callable:
    """``sys.unraisablehook`` that says nothing of a stop swallowed where it landed (a weakref callback): that is
    expected, and the stop is raised again within 0.1 s (:func:`_abandon_again`). Anything else goes to ``hook``."""
    def unraisable(info) -> None:
        if not isinstance(info.exc_value, _Abandoned):
            hook(info)

    return unraisable


def _run(handler: _Handler, lines: Iterator[str]) -> int:
    for line in lines:
        msg = json.loads(line)
        if handler(msg):
            return 0
        if msg["op"] == "start":
            _Stop.starting = False
            if _Stop.asked:  # the stop that came during the set-up: the run is recorded, and now ends KILLED
                _raise_stop()
    handler.abort("KILLED")  # end of input before "end": the stage process died
    return 0


def _serve(lines: Iterator[str]) -> int:
    """The tracking process: the set-up, then one run's calls, one JSON message per line (:class:`StageTracking`).
    End of input before ``end`` (the stage process died) ends the run ``KILLED``.

    SIGTERM or SIGINT (sent to the whole process group, or by the stopping stage itself) ends the run ``KILLED`` at
    once: the call in flight and those queued behind it are dropped. A model still being logged (seconds of
    MLflow's flavour code) must not hold the stop past the stage's grace period. (The exception is raised again
    every 0.1 s until the run is being ended: code that swallows it cannot keep the call going.) A stop during the
    set-up or the run's start waits for them, ``START_WAIT_S`` at most, so the run is recorded before it ends."""
    signal.signal(signal.SIGINT, _abandon)
    signal.signal(signal.SIGTERM, _abandon)
    signal.signal(signal.SIGALRM, _abandon_again)
    sys.unraisablehook = _unraisable(sys.unraisablehook)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)  # a stop sent before now is handled now
    handler = _Handler()
    try:
        try:
            return _run(handler, lines)
        except _Abandoned:
            _Stop.ending = True
    except _Abandoned:  # raised again as the first one was caught
        _Stop.ending = True
    except Exception as e:  # noqa: BLE001 - reported on stderr; the stage process raises TrackingError
        if not _Stop.asked:
            full = disk_full(e) is not None  # the stage process says it in one line (DiskFull)
            if not full:
                logging.getLogger(__name__).exception("curio: MLflow tracking failed: %s", e)
            with contextlib.suppress(Exception):
                handler.abort("FAILED")
            return DISK_FULL_EXIT if full else 1
        # else the stop, turned into another error by the code it landed in (an import: pydantic's __set_name__
        # wraps it in a RuntimeError): the run ends KILLED, as below
    finally:
        _Stop.ending = True
        signal.setitimer(signal.ITIMER_REAL, 0)
    with contextlib.suppress(Exception):
        handler.abort("KILLED")
    return 0


class TrackingService:
    """A pipeline run's stages' MLflow calls, carried out in the pipeline's process (MLflow loaded, store open) on a
    Unix socket: one connection and one thread per stage run, the same messages as :func:`_serve` reads. A
    connection that ends before ``end`` (the stage process died) ends its run ``KILLED``; ``abort`` (the stage is
    stopping) ends it ``KILLED`` after the call in flight, dropping the calls queued behind it. The answer to
    ``end`` is one line: ``{"code": 0}``, or the exit status the tracking process would have had and the error."""

    def __init__(self, mlflow: Any) -> None:
        self.mlflow = mlflow
        self.dir = tempfile.mkdtemp(prefix="curio-mlflow-")
        self.path = os.path.join(self.dir, "socket")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(16)
        self.sock.settimeout(0.2)  # the accepting thread looks at self.stopping this often
        self.stopping = threading.Event()
        self.sessions: list[threading.Thread] = []
        self.accepting = threading.Thread(target=self._accept, name="curio-tracking", daemon=True)
        self.accepting.start()

    def _accept(self) -> None:
        """Take connections until stopped, then those already waiting (a stopped stage does not wait for its
        answer, so its connection may still be queued when the pipeline ends)."""
        while True:
            stopping = self.stopping.is_set()
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                if stopping:
                    return
                continue
            except OSError:
                return
            conn.settimeout(None)
            session = threading.Thread(target=self._session, args=(conn,), name="curio-tracking-run", daemon=True)
            self.sessions.append(session)
            session.start()

    def _session(self, conn: socket.socket) -> None:
        queue: deque[dict] = deque()
        ready = threading.Condition()
        state = {"eof": False, "abort": False}

        def read() -> None:
            with contextlib.suppress(OSError, ValueError):
                for line in conn.makefile("r", encoding="utf-8"):
                    msg = json.loads(line)
                    with ready:
                        if msg["op"] == "abort":
                            state["abort"] = True
                            ready.notify()
                            return
                        queue.append(msg)
                        ready.notify()
            with ready:
                state["eof"] = True
                ready.notify()

        threading.Thread(target=read, name="curio-tracking-read", daemon=True).start()
        handler = _Handler()
        handler.mlflow = self.mlflow
        answer: dict[str, Any] = {"code": 0}
        with conn:
            try:
                while True:
                    with ready:
                        while not (queue or state["eof"] or state["abort"]):
                            ready.wait()
                        if state["abort"] or not queue:  # stopping, or the stage process died before "end"
                            if handler.calls is None and (start := [m for m in queue if m["op"] == "start"]):
                                handler(start[0])  # the run is recorded, as KILLED, even if it had not begun
                            handler.abort("KILLED")
                            return
                        msg = queue.popleft()
                    if handler(msg):
                        break
            except Exception as e:  # noqa: BLE001 - sent to the stage process, which raises TrackingError
                full = disk_full(e) is not None
                answer = {"code": DISK_FULL_EXIT if full else 1, "error": f"{type(e).__name__}: {e}"}
                with contextlib.suppress(Exception):
                    handler.abort("FAILED")
            with contextlib.suppress(OSError):
                conn.sendall((json.dumps(answer) + "\n").encode("utf-8"))

    def close(self, timeout: float = 60) -> None:
        """Stop taking connections; give the runs in flight ``timeout`` seconds to end."""
        self.stopping.set()
        self.accepting.join()
        with contextlib.suppress(OSError):
            self.sock.close()
        for session in self.sessions:
            session.join(timeout)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def stage_run(
    stage: str, params: dict, experiment: str = "curio", enabled: bool = True, tags: dict | None = None,
    artifact_root: str = "mlartifacts", uri: str | None = None,
) -> Iterator[Tracker]:
    """An MLflow run for one stage, nested under ``$CURIO_PARENT_RUN_ID`` when set (:class:`StageTracking`)."""
    with StageTracking(experiment, enabled, artifact_root, uri) as tracking, \
            tracking.run(stage, params, tags) as tracker:
        yield tracker


@contextlib.contextmanager
def pipeline_run(name: str, experiment: str = "curio", enabled: bool = True,
                 artifact_root: str = "mlartifacts", uri: str | None = None) -> Iterator[str | None]:
    """The parent run of a whole pipeline; exports its id so child processes nest under it."""
    if not enabled:
        yield None
        return
    mlflow = _setup(experiment, artifact_root, uri)
    with mlflow.start_run(run_name=name, tags={"curio.kind": "pipeline", **git_tags()}) as run:
        service = TrackingService(mlflow) if os.environ.get(SERVICE_ENV, "1") != "0" else None
        exported = {PARENT_ENV: run.info.run_id}
        if service is not None:
            exported.update({SOCKET_ENV: service.path, SERVICE_KEY_ENV: service_key(experiment, artifact_root, uri)})
        old = {k: os.environ.get(k) for k in exported}
        os.environ.update(exported)
        try:
            yield run.info.run_id
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            if service is not None:
                service.close()


def git_tags() -> dict[str, str]:
    """The checkout's commit (MLflow's own source tag and Curio's) and whether uncommitted changes exist."""
    def git(*args: str) -> str:
        res = subprocess.run(["git", *args], capture_output=True, text=True)
        return res.stdout.strip() if res.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {}
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"mlflow.source.git.commit": commit, "curio.git_commit": commit, "curio.git_dirty": str(dirty).lower()}


if __name__ == "__main__":
    sys.exit(_serve(sys.stdin))
