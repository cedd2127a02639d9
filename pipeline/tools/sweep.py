"""A seed sweep as DVC experiments: ``curio sweep seeds N [PRESET...]``.

Each seed is a DVC experiment of the checkout's commit, named ``seed-K`` (``PRESETS-seed-K`` with presets, e.g.
``smollm2-learn-seed-1``), queued with ``dvc exp run --queue -n NAME [TARGET] -S seed=K`` and the presets' ``-S``
arguments (``curio preset``), and run by DVC's queue (``dvc queue start -j 1``: one at a time, each in a copy of the
checkout under ``.dvc/tmp/exps``). ``dvc exp show`` lists them beside the baseline; ``dvc queue logs NAME`` shows one's
output. The command follows each seed's output until every seed has finished, then prints the sweep's tables
(pipeline/reporting/seeds.py) and writes them to ``data/seeds/NAME/`` (``seeds.md``, ``seeds.json``).

Resumable: a seed whose experiment finished is not run again; one that is queued or running is followed; one that
failed (or was killed) is removed from the queue and queued again. Stopped (SIGINT / SIGTERM), the command kills the
seed that is running and stops the queue's worker, so nothing keeps running; the same command then resumes. The unit
of resume is the seed: a seed stopped midway runs again from its start (its copy of the checkout is gone, and the
stages' outputs are ``persist``, which DVC's run cache does not keep). Seeds are experiments of the checkout's
commit: after a new commit the same command runs a new sweep.

The seeds' stages log to this checkout's MLflow store and share its LLM response cache (``MLFLOW_TRACKING_URI``,
``CURIO_CACHE_DIR``, unless set), with the kernels the sweep's params ask for (``reproducible``, ``threads``). Each
stage runs as a process of its own (no warm start, ``CURIO_WARM=0``): it runs in the queue's copy of the checkout,
whose modules a server loaded here is not, and in the queue worker's environment, which is not this one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.config import ConfigError, dvc_set_param, preset_overrides
from pipeline.core.errors import CurioError
from pipeline.params import load_params
from pipeline.tools import ToolError
from pipeline.tools.seed_table import FINISHED, dvc, experiments, write_seed_tables

POLL_S = 5.0
STOP_WAIT_S = 120.0  # a stopped sweep waits this long at most for the queue's worker to exit


class SweepStopped(CurioError):
    """The sweep was stopped by a signal; the rerun resumes it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"sweep stopped ({signal.Signals(signum).name}): the seed that was running is killed, the "
                         "queue's worker stopped; finished seeds are kept: rerun the same command to resume")
        self.exit_code = 128 + signum


def sweep_prefix(presets: list[str]) -> str:
    """The experiments' name before ``seed-K``: the presets' file names, joined by ``+``, and a dash."""
    return "+".join(Path(p).stem for p in presets) + "-" if presets else ""


def experiment_name(prefix: str, seed: int) -> str:
    return f"{prefix}seed-{seed}"


def queue_args(presets: list[str], targets: list[str]) -> list[str]:
    """The presets' ``-S`` arguments as ``dvc exp run`` takes them, checked against the params schema first."""
    overrides = preset_overrides(*presets) if presets else []
    load_params("params.yaml", overrides)
    raw = yaml.safe_load(Path("params.yaml").read_text(encoding="utf-8"))
    return [*targets, *(a for o in overrides for a in ("-S", dvc_set_param(o, raw)))]


def enqueue(names: dict[int, str], args: list[str]) -> list[str]:
    """Queue every seed whose experiment has not finished and is not queued or running (a failed one is removed
    from the queue first); one line per seed saying which."""
    found = experiments()
    said = []
    for seed, name in names.items():
        state = found.get(name, {}).get("state")
        if state == FINISHED:
            said.append(f"{name}: finished (experiment {str(found[name]['rev'])[:7]})")
            continue
        if state in ("queued", "running"):
            said.append(f"{name}: {state}")
            continue
        if state is not None:  # failed or killed: its queue entry goes before the name can be queued again
            dvc("queue", "remove", found[name]["task"] or name)
        dvc("exp", "run", "--queue", "-n", name, *args, "-S", f"seed={seed}")
        said.append(f"{name}: queued" + (f" again (its last run {state})" if state else ""))
    return said


def follow(names: list[str]) -> dict[str, str]:
    """Run the queue until none of ``names`` is queued or running, showing each one's output while it runs; their
    final states."""
    shown: set[str] = set()
    while True:
        found = {n: e for n, e in experiments().items() if n in names}
        states = {n: e["state"] for n, e in found.items()}
        pending = [n for n in names if states.get(n) in ("queued", "running")]
        if not pending:
            return states
        running = [n for n in pending if states[n] == "running"]
        if running and running[0] not in shown:
            name = running[0]
            shown.add(name)
            # by its queue task: a name is the same on every commit a sweep ran on, and DVC's logs pick the first
            task = str(found[name].get("task") or name)[:7]
            print(f"curio sweep: {name} running (`dvc queue logs {task}`)", flush=True)
            subprocess.run(["dvc", "queue", "logs", "-f", task])  # returns when it ends
            continue
        if not running:
            start_worker()  # a worker, unless one runs (it exits once the queue is empty)
        time.sleep(POLL_S)


def start_worker() -> None:
    """``dvc queue start -j 1``: one worker takes the queue's seeds one at a time (none is started while one runs).
    The worker is a daemon that inherits the command's stdout and stderr: they go to /dev/null, else waiting for
    the command's output would wait for the worker to exit (`dvc queue logs` shows each seed's)."""
    res = subprocess.run(["dvc", "queue", "start", "-j", "1"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    if res.returncode != 0:
        raise ToolError("dvc queue start: failed (`dvc queue status` says why)")


def queue_workers() -> list[Any]:
    """This checkout's DVC queue workers (``dvc exp queue-worker``, each working in a folder of the checkout): one
    told to stop still runs the seed it has taken."""
    import psutil

    here = Path.cwd().resolve()
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        cwd = proc.info["cwd"]
        if "queue-worker" in (proc.info["cmdline"] or []) and cwd and Path(cwd).resolve().is_relative_to(here):
            found.append(proc)
    return found


def stop_seeds(names: list[str], wait_s: float = STOP_WAIT_S) -> None:
    """Stop the queue's worker and kill each of ``names`` it runs, until it has exited (at most ``wait_s``): a seed
    the worker took just before the stop shows as running only once its run has started, after the stop."""
    dvc("queue", "stop", check=False)  # the worker takes no other seed
    killed: set[str] = set()
    deadline = time.monotonic() + wait_s
    while True:
        running = {n: e for n, e in experiments().items() if n in names and e["state"] == "running"}
        if fresh := {n: e for n, e in running.items() if n not in killed}:  # by queue task, as follow() does
            dvc("queue", "kill", *(str(e["task"] or n)[:7] for n, e in fresh.items()), check=False)
            killed |= set(fresh)
        if (not running and not queue_workers()) or time.monotonic() > deadline:
            return
        time.sleep(1.0)


@contextlib.contextmanager
def stop_on_signal(names: list[str]) -> Iterator[None]:
    """SIGINT / SIGTERM: kill the running seed, stop the queue's worker and raise :class:`SweepStopped`."""
    def stop(signum: int, _frame: object) -> None:
        signal.signal(signum, signal.SIG_IGN)  # one stop at a time
        stop_seeds(names)
        raise SweepStopped(signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def shared_stores(params: Any) -> None:
    """The seeds' stages log to this checkout's MLflow store and read its LLM cache (they run in copies of it)."""
    os.environ.setdefault("CURIO_CACHE_DIR", str(Path.cwd() / ".cache" / "curio"))
    if not params.tracking.uri:
        os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{Path.cwd() / 'mlflow.db'}")


def sweep_seeds(count: int, presets: list[str], first: int, targets: list[str]) -> list[str]:
    """Queue, run and follow the seeds; the sweep's tables (pipeline/reporting/seeds.py) once every seed has
    finished."""
    from pipeline.core.kernels import settle
    from pipeline.core.tracking import pipeline_run
    from pipeline.core.warm import ENABLE_ENV

    if not Path("dvc.yaml").is_file():
        raise ToolError("no dvc.yaml here: run `curio sweep` in the project's checkout")
    # dvc, and the stages' curio, from this environment (`.venv/bin/curio sweep` without an activated venv)
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    prefix = sweep_prefix(presets)
    names = {seed: experiment_name(prefix, seed) for seed in range(first, first + count)}
    try:
        args = queue_args(presets, targets)
        params = load_params("params.yaml", [*(preset_overrides(*presets) if presets else []), f"seed={first}"])
    except (OSError, ConfigError) as e:
        raise ToolError(str(e).splitlines()[0]) from None
    start = time.perf_counter()
    for line in enqueue(names, args):
        print(f"curio sweep: {line}", flush=True)
    settle(params.reproducible, params.threads)  # the kernels of the queue's worker and its stages
    os.environ[ENABLE_ENV] = "0"  # no warm start (see the module's docstring)
    shared_stores(params)
    tracking = params.tracking  # the seeds' stage runs nest under one MLflow run of the sweep, as under make run
    with stop_on_signal(list(names.values())), \
            pipeline_run(f"sweep {prefix}seeds", experiment=tracking.experiment, enabled=tracking.enabled,
                         artifact_root=tracking.artifact_root, uri=tracking.uri):
        start_worker()
        states = follow(list(names.values()))
    print(f"curio sweep: {time.perf_counter() - start:.0f} s this run", flush=True)
    failed = [n for n in names.values() if states.get(n) != FINISHED]
    if failed:
        raise ToolError(f"{', '.join(failed)} did not finish (`dvc queue logs {failed[0]}` says why); rerun the same "
                        "command to run them again")
    return write_seed_tables(prefix, list(names.values()))
