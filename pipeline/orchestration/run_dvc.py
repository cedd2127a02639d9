"""`make run`: `dvc repro` with every stage's MLflow run nested under one pipeline run.

    python -m pipeline.orchestration.run_dvc                  # `dvc repro`, one stage at a time (what `make run` runs)
    python -m pipeline.orchestration.run_dvc ARGS...          # `dvc repro ARGS...` (targets, -f, ...)
    python -m pipeline.orchestration.run_dvc --side-by-side   # the DAG's independent branches at the same time

`--side-by-side`: the text track and the NetHack track share no stage, so while `dvc repro` runs the longest
branch, this process runs each other branch's stages (their dvc.yaml `cmd`, in dependency order, only those
`dvc status` flags and their descendants, as `dvc repro` would) on the CPU time it leaves idle, then records them
with `dvc commit` and lets `dvc repro` run what joins the branches (the report). `dvc.lock` ends as a plain
`dvc repro` leaves it, and a stage's results do not depend on what runs beside it (its own thread counts and
seeds). It is for machines with cores a stage leaves idle: on a 2-core machine it gained 4 % (docs/speed.md).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import yaml

from pipeline.core import dvcrepo
from pipeline.core.config import ConfigError
from pipeline.core.dag import branches, commands, stage_parents
from pipeline.core.kernels import settle
from pipeline.core.tracking import pipeline_run
from pipeline.core.warm import ENABLE_ENV, SOCKET_ENV, start_server
from pipeline.params import load_params

_LINE_END = re.compile(rb"[\r\n]")
# Stages beside dvc repro's get only the CPU time its stage leaves idle (Linux's SCHED_IDLE; elsewhere nice 19), so
# the longest branch, the run's critical path, is slowed as little as possible: at nice 10 they took enough of the
# cores to stretch dvc repro's branch by 130 s, more than the run gained. (On a 2-core VM even SCHED_IDLE neighbours
# slowed it: caches and memory are shared whatever the scheduler says.)
SIDE_NICE = 19


# The command's shell is started by a Python that lowers its own priority and then becomes the shell (exec), so
# every process the command starts inherits it: lowering it from here after Popen raced the shell, whose first
# children could start before it landed.
_IDLE_SHELL = ("import os, sys\n"
               "try:\n"
               "    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
               "except (AttributeError, OSError):\n"
               f"    os.setpriority(os.PRIO_PROCESS, 0, {SIDE_NICE})\n"
               "os.execv('/bin/sh', ['/bin/sh', '-c', sys.argv[1]])\n")


def idle_command(cmd: str) -> list[str]:
    """``cmd`` as a shell command that runs, with everything it starts, only on otherwise idle CPU time."""
    return [sys.executable, "-c", _IDLE_SHELL, cmd]


class Branch(threading.Thread):
    """Runs one branch's stages in dependency order, each as its dvc.yaml command, output prefixed by the stage."""

    def __init__(self, stages: list[str], flagged: set[str], cmds: dict[str, str], parents: dict[str, set[str]]):
        super().__init__(daemon=True)
        self.stages, self.flagged, self.cmds, self.parents = stages, flagged, cmds, parents
        self.finished: list[str] = []
        self.failed: tuple[str, int] | None = None
        self.proc: subprocess.Popen | None = None
        self.stopping = False

    def run(self) -> None:
        for name in self.stages:
            if self.stopping:
                return
            if name not in self.flagged and not (self.parents[name] & set(self.finished)):
                print(f"Stage '{name}' didn't change, skipping (beside dvc repro)", flush=True)
                continue
            print(f"Running stage '{name}' (beside dvc repro):\n> {self.cmds[name]}", flush=True)
            t0 = time.perf_counter()
            # tqdm redraws a bar with \r; beside dvc repro's output each redraw becomes a prefixed line: draw fewer
            env = {**os.environ, "TQDM_MININTERVAL": os.environ.get("TQDM_MININTERVAL", "10")}
            self.proc = subprocess.Popen(idle_command(self.cmds[name]), env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT)
            assert self.proc.stdout is not None
            buf = b""
            for chunk in iter(lambda: self.proc.stdout.read1(65536), b""):
                *lines, buf = _LINE_END.split(buf + chunk)
                for line in lines:
                    if line.strip():
                        sys.stdout.write(f"[{name}] {line.decode(errors='replace')}\n")
                sys.stdout.flush()
            if buf.strip():
                print(f"[{name}] {buf.decode(errors='replace')}", flush=True)
            rc = self.proc.wait()
            if rc != 0:
                self.failed = (name, rc)
                print(f"ERROR: stage '{name}' failed (exit {rc}; beside dvc repro)", flush=True)
                return
            self.finished.append(name)
            print(f"Stage '{name}' finished in {time.perf_counter() - t0:.1f} s (beside dvc repro)", flush=True)

    def stop(self) -> None:
        """Stop after the running stage's process is interrupted (its finished parts stay: it resumes)."""
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)


def side_by_side() -> int:
    """The DAG with its branches side by side; the exit code of the first failure, else 0."""
    parallel, _ = branches()
    flagged = dvcrepo.status() if len(parallel) > 1 else None
    if flagged is None:  # one branch, or DVC cannot tell what changed: it reports why itself
        return subprocess.call(["dvc", "repro"])
    cmds = commands()
    parents = stage_parents()
    main, *side = parallel
    threads = [Branch(b, set(flagged), cmds, parents) for b in side]
    for t in threads:
        t.start()
    sinks = [n for n in main if not any(n in parents[m] for m in main)]
    rc = 1
    try:
        t0 = time.perf_counter()
        rc = subprocess.call(["dvc", "repro", *sinks])
        if rc == 0 and any(t.is_alive() for t in threads):
            print(f"dvc repro {' '.join(sinks)}: done in {time.perf_counter() - t0:.1f} s; waiting for the "
                  "branches beside it", flush=True)
    finally:
        if rc != 0:
            for t in threads:
                t.stop()
        for t in threads:
            t.join()
        finished = [n for t in threads for n in t.finished]
        if finished:  # recorded even when the run stops, so the next one skips them
            try:
                dvcrepo.commit(finished)
            except RuntimeError as e:
                print(f"ERROR: {e}", file=sys.stderr)
                rc = rc or 1
    failed = [t.failed for t in threads if t.failed]
    if rc != 0:
        return rc
    if failed:
        return failed[0][1]
    return subprocess.call(["dvc", "repro"])  # what joins the branches (and nothing else: the rest is current)


def _dvc(args: list[str]) -> int:
    """``dvc ARGS`` with this process's SIGTERM passed on: DVC dies of it, and the stage it runs, which gets SIGTERM
    when DVC dies (``curio stage`` under DVC), saves its progress and stops (pipeline.core.interrupt)."""
    proc = subprocess.Popen(["dvc", *args])
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: proc.send_signal(signum))
    try:
        rc = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 128 - rc if rc < 0 else rc  # killed by signal N: 128 + N, as a shell reports it


@contextlib.contextmanager
def warm_start() -> Iterator[None]:
    """The warm start's server (pipeline.stage_server) for the stages' ``curio`` commands, while the block runs:
    unless ``CURIO_WARM=0`` or no stage runs ``curio``."""
    try:
        cmds = list(commands().values())
    except (OSError, KeyError, TypeError, yaml.YAMLError):  # DVC says what is wrong with it
        cmds = []
    if os.environ.get(ENABLE_ENV, "1") == "0" or not any(str(c).startswith("curio ") for c in cmds):
        yield
        return
    where = tempfile.mkdtemp(prefix="curio-warm-")
    path = os.path.join(where, "socket")
    server = start_server(path, stdin=subprocess.DEVNULL)
    os.environ[SOCKET_ENV] = path
    try:
        yield
    finally:
        os.environ.pop(SOCKET_ENV, None)
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(where, ignore_errors=True)


def main(argv: list[str]) -> int:
    try:
        params = load_params("params.yaml")
        # the kernels reproducible / threads ask for, in the environment the warm start and every stage start with
        settle(params.reproducible, params.threads)
    except ConfigError as e:
        print(f"curio: {e}", file=sys.stderr)
        return 2
    from pipeline.core.dvclock import repair

    if repaired := repair("."):  # a run killed while DVC wrote dvc.lock: `dvc repro` would stop at once
        print(f"curio: {repaired}", file=sys.stderr)
    # the server starts in the environment DVC's commands get, the pipeline run's included
    with pipeline_run("dvc-repro", experiment=params.tracking.experiment, enabled=params.tracking.enabled,
                      artifact_root=params.tracking.artifact_root, uri=params.tracking.uri), warm_start():
        if argv == ["--side-by-side"]:
            return side_by_side()
        return _dvc(["repro", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
