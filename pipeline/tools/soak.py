"""A soak (``curio soak``): the default DAG (`dvc repro`) under N random interruptions, SIGKILL and SIGTERM mixed,
each followed by a resume, compared with an uninterrupted run of the same budget.

    curio soak                        # 100 interruptions, seed 0, the small budget (hours: the machine alone)
    curio soak -n 5 --seed 1          # a quick check
    curio soak -n 20 -S rollout_text.trajectories_per_task=8 --keep /tmp/soak
    curio soak -n 6 $(curio preset presets/smollm2.yaml presets/vllm.yaml presets/vllm-judge.yaml)  # all on vLLM
    curio soak -n 20 --target rl-text --stages rl-text $(curio preset presets/smollm2-learn.yaml presets/vllm.yaml) \
        -S games.max_train_tasks=6 -S rl_text.rounds=2 -S rl_text.tasks_per_round=3 -S rl_text.max_val_tasks=4 \
        -S train_policy.sft.epochs=1 -S train_policy.dpo.epochs=1   # GRPO on vLLM, interrupted
    curio soak --make-run             # each run as `make run` runs the DAG: its warm start too

Makes a fresh copy of this checkout's project (dvc.yaml, params.yaml with the budget's values, pipeline/, stages/;
`git init`, `dvc init`) in a temp dir and runs `dvc repro` once, uninterrupted: its stages' wall times place the
interruptions. A second fresh copy (with ``--stages``: a copy of the first without the outputs of those stages and
the ones after them, so they run from the same inputs), in the same place (paths written into outputs agree), runs
`dvc repro` again and again (a soak lasts about N x (half the interrupted stage's wall time + a restart): soak a
short stage; a SIGTERM or
Ctrl-C to the soak stops the run it started, and no process outlives it): each interruption is planned on a stage
(the stages in turn, so all of them get some), at a random moment of what that stage has left after it (re)starts
(its uninterrupted wall time less the time it ran before its earlier interruptions, half of it at least), with
SIGKILL or SIGTERM (seeded); it goes to the whole process group, as a supervisor, Prefect or the OOM killer sends
it: DVC, the stage and every process they started. After each one the soak waits for every process of the group to
end (this process is their subreaper), checks a SIGTERMed stage exited 143 within ``runner.grace_s`` with its one
line, and reruns `dvc repro`. An interruption whose stage finishes first moves on to the next stage; those left when
the DAG completes go to its last stage, run again from scratch (its resumable outs removed, then `dvc repro --force
--single-item`) until each is sent, then
resumed by a plain `dvc repro`. At the end it prints the interruptions by signal and stage, the rows of every
dataset against the uninterrupted run's (rows lost: the goal is 0), each stage's outs (dvc.lock's hashes, then the
files that differ) and metrics (`curio compare runs`' comparison, leaving out wall-clock keys and where a trainer
resumed from), and the wall time against the uninterrupted run's. A stage with ``backend: vllm`` runs its server in
a process group of its own, under a supervisor that stops it when the stage dies: after each interruption the soak
also waits for every vLLM server to end (60 s at most, else a problem).

sample-factory does not save its environments' state, so rl-nethack after an interruption (and what reads it) is a
valid continuation, not the same bits; the soak says so beside those stages.

``--make-run``: each run (both projects') is `python -m pipeline.orchestration.run_dvc ARGS`, what `make run` runs,
instead of `dvc repro ARGS`: the pipeline's MLflow run around `dvc repro`, its own repair of an unreadable dvc.lock
(listed at the end as the soak's are), and the warm start (pipeline.stage_server and the copies it forks for the stages'
commands, in the same process group, so each interruption reaches them too and the soak waits for every one of them to
end). A `curio` stage's clock then starts when its copy does: after an interruption the next run's server loads again,
and the stage it resumes with waits for it (seconds, where most stages of the small budget take one or two).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.config import RunnerConfig, _set_dotted, parse_override
from pipeline.core.dag import commands, stage_outputs, stage_parents
from pipeline.tools import REPO
from pipeline.tools.compare_runs import TIMING, metrics, outs

# The text track's small budget: every stage runs for real, in seconds (the test suite's shared run too).
TEXT_SMALL = [
    "games.max_train_tasks=12", "games.max_eval_tasks=6",
    "rollout_text.trajectories_per_task=4", "rollout_text.tasks_per_chunk=4",
    "train_policy.sft.epochs=1", "train_policy.dpo.epochs=1", "train_policy.save_steps=2",
    "rl_text.rounds=2", "rl_text.tasks_per_round=4", "rl_text.trajectories_per_task=2", "rl_text.epochs=1",
    "evaluate_text.trajectories_per_task=1",
]
# The soak's small budget: both tracks, a few minutes each stage (NetHack's as tests/conftest.py's NETHACK_TINY),
# sample-factory in its deterministic mode so that two uninterrupted runs agree.
SMALL = [
    *TEXT_SMALL,
    "rollout_nethack.episodes=4", "rollout_nethack.episodes_per_chunk=2", "rollout_nethack.max_episode_steps=300",
    "annotate_nethack.num_pairs=600", "annotate_nethack.pairs_per_chunk=200",
    "train_reward.epochs=4", "train_reward.batch_size=128",
    "rl_nethack.train_for_env_steps=4096", "rl_nethack.num_envs_per_worker=4", "rl_nethack.batch_size=256",
    "rl_nethack.max_episode_steps=400", "rl_nethack.deterministic=true",
    "evaluate_nethack.episodes=2", "evaluate_nethack.max_episode_steps=150",
]
NOT_BITWISE = {"rl-nethack": "sample-factory restarts its environments on resume",
               "evaluate-nethack": "evaluates rl-nethack's agents", "report": "summarises every stage"}
# metrics saying how a run went, not what it made: where a trainer resumed, the LLM requests this run sent
RUN_HISTORY = re.compile(r"resumed_from|_requests$|_sent$|_cache_hits$")
# files that differ between any two runs, interrupted or not
VOLATILE = {re.compile(r"checkpoint-\d+/training_args\.bin$"): "the Trainer's arguments name its start time",
            re.compile(r"checkpoints/README\.md$"): "TRL's model card lists its tags in set order",
            re.compile(r"(events\.out\.tfevents\.|curio_train\.log$|sf_log\.txt$|curio_summary\.json$)"):
                "sample-factory's logs, event files and speed"}
STAGE_LINE = re.compile(r"^Running stage '([^']+)':")
STOP_LINE = re.compile(r"curio: stopped by SIGTERM: .+")
LOCK_BROKEN = re.compile(r"dvc\.lock' (validation failed|format error)|Lockfile .* is corrupted")
PR_SET_CHILD_SUBREAPER = 36


def project(root: Path, overrides: list[str]) -> Path:
    """A fresh DVC project: this checkout's project files, params.yaml with ``overrides``."""
    root.mkdir(parents=True)
    for name in ("dvc.yaml", "pipeline", "stages", ".gitignore"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, root / name)
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    for o in overrides:
        _set_dotted(raw, *parse_override(o))
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"]):
        subprocess.run(cmd, cwd=root, env=environment(root), check=True, capture_output=True)
    return root


def environment(root: Path) -> dict[str, str]:
    vllm = REPO / ".venv-vllm" / "bin" / "python"  # this checkout's `make vllm`
    return {**({"CURIO_VLLM_PYTHON": str(vllm)} if vllm.exists() else {}), **os.environ, "TQDM_DISABLE": "1",
            "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(root), "CURIO_WARM_VERBOSE": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


DVC_REPRO = ("dvc", "repro")
MAKE_RUN = (sys.executable, "-m", "pipeline.orchestration.run_dvc")  # `make run`'s command: `dvc repro ARGS` within it
IN_COPY = re.compile(r"^curio: warm start: `(.+)` runs in a copy")  # pipeline.stage_server, CURIO_WARM_VERBOSE=1
NOT_IN_COPY = re.compile(r"^curio: the warm start (declined|was still loading|did not start)")  # pipeline.core.warm
REPAIRED = re.compile(r"^curio: (.*dvc\.lock was unreadable.*)")  # make run's repair, at its start


#: The runs started and not yet waited for (:class:`Repro`): what a stopped soak stops with it.
RUNS: list[subprocess.Popen] = []


def stop_runs(grace_s: float) -> None:
    """Stop every run the soak started, as a supervisor stops a job: SIGTERM to each run's process group (DVC, the
    stage and what it started), SIGKILL to what is left after ``grace_s``. A stage's vLLM server, in a group of its
    own, is stopped by its supervisor once the stage is gone."""
    for proc in RUNS:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in RUNS:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group's stragglers, the leader ended or not
        proc.wait()


def stop_on_signals(grace_s: float) -> None:
    """A soak that gets SIGTERM, SIGINT or SIGHUP stops the run it started before it exits (128 + the signal): its
    runs are in process groups of their own, which a signal to the soak's group does not reach."""
    def handler(signum: int, _frame) -> None:
        stop_runs(grace_s)
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, handler)


class Repro:
    """One `dvc repro` (or ``command``: `make run`'s) in its own process group; its output lines (all the group's) as
    they come."""

    def __init__(self, root: Path, log, *args: str, command: tuple[str, ...] = DVC_REPRO) -> None:
        RUNS[:] = [proc for proc in RUNS if proc.poll() is None]
        self.proc = subprocess.Popen([*command, *args], cwd=root, env=environment(root), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
        RUNS.append(self.proc)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.log = log
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # until every process holding the pipe has ended
            self.log.write(line)
            self.log.flush()
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def next_line(self, timeout: float) -> str | None | bool:
        """The next line, None at the end of the output, False when none came within ``timeout``."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return False

    def members(self) -> dict[int, str]:
        """The group's live processes and their command lines."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                fields = stat[stat.rindex(")") + 2:].split()
                if int(fields[2]) == self.proc.pid and fields[0] != "Z":
                    found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        return found


def servers(root: Path, wait_s: float = 0.0) -> list[int]:
    """Pids of the vLLM servers of the project at ``root`` (started there: their working directory is in it) still
    running after up to ``wait_s`` (a stage with ``backend: vllm`` starts one). Another project's servers, a user's
    run beside the soak, are not the soak's to wait for or to kill."""
    deadline = time.monotonic() + wait_s
    root = root.resolve()
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if (entry.name.isdigit() and b"vllm.entrypoints.openai.api_server" in (entry / "cmdline").read_bytes()
                        and (entry / "cwd").resolve().is_relative_to(root)):
                    found.append(int(entry.name))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)
        reap()


def reap() -> dict[int, int]:
    """Exit codes of the ended children (this process adopts the group's orphans), by pid."""
    codes = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return codes
        if pid == 0:
            return codes
        codes[pid] = os.waitstatus_to_exitcode(status)


@dataclass
class Interruption:
    signal: signal.Signals
    stage: str
    after_s: float  # since the stage (re)started
    stopped_s: float = 0.0  # until every process of the group ended
    stage_exit: int | None = None  # the stage's exit status (SIGTERM)
    line: str = ""
    in_copy: bool = False  # the stage ran in a warm start's copy (--make-run)


def uninterrupted(root: Path, log, command: tuple[str, ...] = DVC_REPRO) -> tuple[dict[str, float], float]:
    """The DAG once; each stage's wall time (from its "Running stage" line, or from its warm start's copy starting,
    to the next stage's line) and the total."""
    t0 = time.monotonic()
    run = Repro(root, log, command=command)
    cmds = commands(root / "dvc.yaml")
    durations: dict[str, float] = {}
    current, started = None, t0
    while (line := run.next_line(3600)) is not None:
        if line and current and (m := IN_COPY.match(line)) and m[1] == cmds[current]:
            started = time.monotonic()  # it waited for the server until now (check-params)
        if line and (m := STAGE_LINE.match(line)):
            now = time.monotonic()
            if current:
                durations[current] = now - started
            current, started = m[1], now
            print(f"  uninterrupted: {current}", flush=True)
    rc = run.proc.wait()
    if current:
        durations[current] = time.monotonic() - started
    if rc != 0:
        sys.exit(f"the uninterrupted run failed (exit {rc}); see {log.name}")
    return durations, time.monotonic() - t0


def plan(durations: dict[str, float], n: int, rng: random.Random, kill_share: float,
         only: list[str] | None = None) -> dict[str, list]:
    """``n`` interruptions over the stages in turn (DAG order, starting at a random stage; ``only``: those stages
    alone), each a signal."""
    stages = [s for s in durations if not only or s in only]
    if not stages:
        sys.exit(f"--stages {','.join(only or [])}: none of them runs in this DAG ({', '.join(durations)})")
    first = rng.randrange(len(stages))
    planned: dict[str, list] = {s: [] for s in durations}
    for i in range(n):
        sig = signal.SIGKILL if rng.random() < kill_share else signal.SIGTERM
        planned[stages[(first + i) % len(stages)]].append(sig)
    return planned


def window(duration: float, spent: float) -> float:
    """How long after a stage (re)starts its next interruption may come: what it has left, about. A stage that
    resumes has less to do than its uninterrupted wall time; drawing from the whole of it put most moments after
    the stage had ended, and those piled up on the DAG's last stage (the fifth soak sent 62 of 100). Half the wall
    time at least: a stage starts Python again (seconds of imports before its handlers are in place) and starts
    over (report) or repeats its chunk in flight; with a quarter, three SIGTERMs in four came during the imports.
    """
    return max(duration - spent, duration / 2)


def reuse_upstream(straight: Path, root: Path, stages: list[str]) -> Path:
    """The interrupted project for ``--stages``: a copy of the uninterrupted one without the outputs of those stages
    and of every stage after them, so only they (and what reads them) run again, from the same inputs. Stages the
    soak never interrupts would only repeat (or, sampled on a vLLM server, which does not repeat its draws, not
    repeat) the uninterrupted run."""
    parents = stage_parents(straight / "dvc.yaml")
    rerun = set(stages)
    for name in parents:  # dvc.yaml lists stages in DAG order: a stage after a rerun one reruns too
        if parents[name] & rerun:
            rerun.add(name)
    shutil.copytree(straight, root, symlinks=True)
    outputs = stage_outputs(root / "dvc.yaml")
    for name in rerun & set(outputs):
        for path in outputs[name]:
            out = root / path
            shutil.rmtree(out, ignore_errors=True)
            out.unlink(missing_ok=True)
    return root


def forced_command(command: tuple[str, ...], stages, last: str) -> tuple[str, ...]:
    """``command`` run again for ``last`` alone: `dvc repro` takes its targets in one run, before its options, so
    the soak's own target (a name in ``stages``) is dropped rather than repeated."""
    return (*(c for c in command if c not in stages), "--force", "--single-item", last)


def persistent_outs(dvc_yaml: Path, stage: str) -> list[str]:
    """The ``persist: true`` outs of a stage (what DVC keeps across a rerun, so that the stage resumes)."""
    return [path for path, opts in stage_outputs(dvc_yaml)[stage].items() if opts.get("persist")]


@dataclass
class Soak:
    """`dvc repro` (or ``command``) until it completes, interrupted as planned (:meth:`run`)."""

    root: Path
    durations: dict[str, float]
    planned: dict[str, list]
    rng: random.Random
    grace_s: float
    log: Any
    repairs: list[str] | None = None
    command: tuple[str, ...] = DVC_REPRO
    done: list[Interruption] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    carried: list[signal.Signals] = field(default_factory=list)  # planned on a stage that finished first
    spent: Counter[str] = field(default_factory=Counter)  # seconds each stage ran before its interruptions, so far
    failures: int = 0
    forced: int = 0
    force: bool = False
    only: list[str] | None = None  # the stages interruptions go to (None: every stage)

    def __post_init__(self) -> None:
        self.total = sum(len(v) for v in self.planned.values())
        self.cmds = commands(self.root / "dvc.yaml")
        self.last = [s for s in self.durations if not self.only or s in self.only][-1]

    def run(self) -> tuple[list[Interruption], float, list[str]]:
        """The interruptions, the wall time, problems seen. A dvc.lock left unreadable (DVC killed while it rewrote
        the file) is repaired as a user would, with `curio repair-lock` (what `make run` does by itself: with
        ``MAKE_RUN`` its line is read instead), and noted in ``repairs``."""
        t0 = time.monotonic()
        while True:
            command = self.command
            if self.force:
                # dvc repro takes its targets in one run: the forced run names the last stage only (the soak's
                # --target dropped), which starts again from scratch, its resumable outs removed
                command = forced_command(self.command, self.cmds, self.last)
                for out in persistent_outs(self.root / "dvc.yaml", self.last):
                    shutil.rmtree(self.root / out, ignore_errors=True)
                    (self.root / out).unlink(missing_ok=True)
            run = Repro(self.root, self.log, command=command)
            self.force = False
            fired, stages, started = self.watch(run)
            if fired is None:  # the run ended by itself
                if self.ended(run):
                    return self.done, time.monotonic() - t0, self.problems
                continue
            self.failures = 0
            self.settle(run, fired, stages, started)
            self.done.append(fired)
            print(f"  [{len(self.done)}/{self.total}] {fired.signal.name} {fired.stage}"
                  f"{' (in a copy)' if fired.in_copy else ''} at {fired.after_s:.1f} s: all ended in "
                  f"{fired.stopped_s:.1f} s {stop_text(fired, stages)}", flush=True)

    def note_repair(self, line: str) -> None:
        last_one = self.done[-1] if self.done else None
        self.repairs.append((f"after {last_one.signal.name} {last_one.stage} at {last_one.after_s:.1f} s: "
                             if last_one else "") + line)
        print(f"  ! {line}", flush=True)

    def watch(self, run: Repro) -> tuple[Interruption | None, dict[int, str], float]:
        """Follow the run's lines, sending the planned signal at its moment; the interruption (None: the run
        ended first), the stage's processes when it was sent, and when that stage (re)started."""
        current, started, moment, in_copy, waiting = None, 0.0, None, False, False
        while True:
            line = run.next_line(0.05)
            if line is None:
                return None, {}, started
            now = time.monotonic()
            if line and self.repairs is not None and (m := REPAIRED.match(line)):
                self.note_repair(m[1])
            if line and current and (m := IN_COPY.match(line)) and m[1] == self.cmds[current]:
                # the stage's clock starts with its copy: a command waits while a resumed run's server loads
                in_copy, waiting, started = True, False, now
            if line and NOT_IN_COPY.match(line):
                waiting = False
            if line and (m := STAGE_LINE.match(line)):
                in_copy, waiting = False, self.command == MAKE_RUN and self.cmds[m[1]].startswith("curio ")
                if current and self.planned.get(current):
                    self.carried.extend(self.planned.pop(current))
                current, started = m[1], now
                if self.carried and (not self.only or current in self.only):
                    self.planned.setdefault(current, [])[:0] = self.carried
                    self.carried = []
                moment = self.rng.uniform(0.0, window(self.durations.get(current, 10.0), self.spent[current])) \
                    if self.planned.get(current) else None
            if current and moment is not None and not waiting and now - started >= moment:
                fired = Interruption(self.planned[current].pop(0), current, now - started, in_copy=in_copy)
                self.spent[current] += fired.after_s
                stages = {pid: cmd for pid, cmd in run.members().items() if self.cmds[current] in cmd}
                os.killpg(run.proc.pid, fired.signal)
                return fired, stages, started

    def ended(self, run: Repro) -> bool:
        """A run that ended by itself: True when the soak is over, False to run `dvc repro` again."""
        rc = run.proc.wait()
        reap()
        if rc == 0:
            left = [*self.carried, *(sig for sigs in self.planned.values() for sig in sigs)]  # the last stage's too
            self.carried, self.planned = [], {}
            if left and self.forced < 50:
                # the DAG's last stages finished before their moments: the last stage runs again for them
                # (`dvc repro --force --single-item`, as a job is resubmitted), and a plain `dvc repro` resumes it
                self.planned[self.last], self.force = left, True
                self.forced += 1
                return False
            if left:
                self.problems.append(f"{len(left)} interruption(s) not sent: the DAG's last stage finished before "
                                     "their moments")
            return "--force" not in run.proc.args  # after a forced run, a plain `dvc repro` must find it complete
        if any(LOCK_BROKEN.search(line) for line in run.output[-20:]) and self.repairs is not None:
            # DVC rewrites dvc.lock in place: a kill in that moment leaves it unreadable; the user's repair
            fixed = subprocess.run([sys.executable, "-m", "pipeline.cli", "repair-lock"], cwd=self.root,
                                   env=environment(self.root), capture_output=True, text=True)
            line = fixed.stdout.strip()
            if fixed.returncode == 0 and "unreadable" in line:
                self.note_repair(line)
                return False
        self.failures += 1
        self.problems.append(f"dvc repro failed (exit {rc}) after interruption {len(self.done)}: "
                             + "".join(run.output[-5:]).strip().replace("\n", " | "))
        print(f"  ! dvc repro failed (exit {rc}); rerunning", flush=True)
        if self.failures >= 3:
            self.problems.append("three failed reruns in a row: the soak stopped")
            return True
        return False

    def settle(self, run: Repro, fired: Interruption, stages: dict[int, str], started: float) -> None:
        """After an interruption: wait for every process of the group (and every vLLM server) to end, and check
        how a SIGTERMed stage stopped."""
        codes: dict[int, int] = {}
        deadline = time.monotonic() + self.grace_s + 60
        while run.members() and time.monotonic() < deadline:
            codes.update(reap())
            time.sleep(0.05)
        fired.stopped_s = time.monotonic() - started - fired.after_s
        if run.members():
            self.problems.append(f"{fired.signal.name} {fired.stage}: processes still running "
                                 f"{self.grace_s + 60:.0f} s later: {sorted(run.members().values())}; killed")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.proc.pid, signal.SIGKILL)
        while run.next_line(5) is not None:  # the rest of the output (the stop's line)
            pass
        left = servers(self.root, 60.0)  # a vLLM server runs in a group of its own: its supervisor must stop it too
        if left:
            self.problems.append(f"{fired.signal.name} {fired.stage}: vLLM server(s) still running 60 s later: "
                                 f"{left}")
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        codes.update(reap())
        for pid in set(stages) - set(codes):  # a process whose threads are still ending shows as a zombie first
            with contextlib.suppress(ChildProcessError):
                codes[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        run.proc.wait()
        if fired.signal == signal.SIGTERM and stages:
            fired.stage_exit = next((codes[p] for p in stages if p in codes), None)
            fired.line = next((m[0] for line in run.output if (m := STOP_LINE.search(line))), "")
            # 143: stopped; 0: it had finished its work; -15: Python starting (no handler yet) or exiting (none left);
            # None: the stage process had ended and DVC, still running, took its exit status (DVC prints nothing
            # when it is signalled itself)
            traceback = "Traceback" in "".join(run.output)
            if fired.stage_exit not in (143, 0, -15, None) or fired.stopped_s > self.grace_s or traceback:
                self.problems.append(f"SIGTERM {fired.stage} at {fired.after_s:.1f} s: stage exit {fired.stage_exit}, "
                                     f"everything ended after {fired.stopped_s:.1f} s")


def stop_text(fired: Interruption, stages: dict[int, str]) -> str:
    """How a SIGTERMed stage stopped, in words (nothing for a SIGKILL)."""
    if fired.signal != signal.SIGTERM:
        return ""
    return fired.line.removeprefix("curio: ") or {
        0: "(the stage had finished its work: exit 0)",
        -15: "(ended by the default handler: Python was starting or exiting)",
        None: "(no stage process: DVC was between stages)" if not stages else
              "(the stage had ended: DVC took its exit status)",
    }.get(fired.stage_exit, f"(the stage exited {fired.stage_exit})")


def soak(root: Path, durations: dict[str, float], planned: dict[str, list], rng: random.Random, grace_s: float,
         log, repairs: list[str] | None = None, command: tuple[str, ...] = DVC_REPRO, only: list[str] | None = None
         ) -> tuple[list[Interruption], float, list[str]]:
    """`dvc repro` (or ``command``) until it completes, interrupted as planned; the interruptions, the wall time,
    problems seen (:class:`Soak`)."""
    return Soak(root, durations, planned, rng, grace_s, log, repairs, command, only=only).run()


def dataset_rows(root: Path) -> dict[str, int]:
    """Rows of every dataset under data/ (its manifest's count), by path."""
    return {str(m.parent.relative_to(root)): json.loads(m.read_text()).get("rows", 0)
            for m in sorted((root / "data").rglob("_manifest.json"))}


def files(path: Path) -> dict[str, str]:
    if path.is_file():
        return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()}
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def same(a: object, b: object) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)  # NaN twice


def compare(straight: Path, soaked: Path) -> tuple[int, list[str]]:
    """Rows lost against the uninterrupted run, and the lines describing what differs."""
    report = []
    rows_a, rows_b = dataset_rows(straight), dataset_rows(soaked)
    lost = sum(max(0, n - rows_b.get(p, 0)) for p, n in rows_a.items())
    for p in sorted(set(rows_a) | set(rows_b)):
        if rows_a.get(p) != rows_b.get(p):
            report.append(f"  rows {p}: {rows_a.get(p)} uninterrupted, {rows_b.get(p)} interrupted")
    lock_a = yaml.safe_load((straight / "dvc.lock").read_text())
    lock_b = yaml.safe_load((soaked / "dvc.lock").read_text())
    for stage in lock_a["stages"]:
        oa, ob = outs(lock_a, stage), outs(lock_b, stage)
        data = [p for p in oa if not p.startswith("metrics/")]  # metrics compared key by key, below
        differ = [p for p in data if ob.get(p) != oa[p]]
        ma, mb = metrics(straight, stage), metrics(soaked, stage)
        changed = [k for k in sorted(set(ma) | set(mb))
                   if not TIMING.search(k) and not RUN_HISTORY.search(k) and not same(ma.get(k), mb.get(k))]
        if not differ and not changed:
            continue
        note = f"  ({NOT_BITWISE[stage]})" if stage in NOT_BITWISE else ""
        report.append(f"  {stage}: {len(differ)} of {len(data)} outs and {len(changed)} metrics differ{note}")
        for p in differ:
            fa, fb = files(straight / p), files(soaked / p)
            names = [f for f in sorted(set(fa) | set(fb)) if fa.get(f) != fb.get(f)]
            volatile = sorted({why for f in names for pattern, why in VOLATILE.items() if pattern.search(f)})
            names = [f for f in names if not any(pattern.search(f) for pattern in VOLATILE)]
            report.append(f"    {p}: " + (", ".join(names[:12]) + (f" (+{len(names) - 12} more)" if len(names) > 12
                                                                    else "") if names else "no other file")
                          + (f"; and files that differ between any two runs ({'; '.join(volatile)})" if volatile
                             else ""))
        for k in changed[:12]:
            report.append(f"    metric {k}: {ma.get(k)!r} -> {mb.get(k)!r}")
    return lost, report


def run_soak(interruptions: int = 100, seed: int = 0, kill_share: float = 0.5, overrides: list[str] = (),
             keep: Path | None = None, make_run: bool = False, stages: list[str] | None = None,
             target: str | None = None) -> int:
    """The soak, then what it found (:func:`summary`); exit code 1 when a row was lost or a problem seen. ``stages``:
    the interruptions go to these stages only; ``target``: the DAG up to this stage (`dvc repro TARGET`)."""
    rng = random.Random(seed)
    overrides = [*SMALL, *overrides]
    grace_s = RunnerConfig().grace_s
    for o in overrides:
        if o.startswith("runner.grace_s="):
            grace_s = float(o.split("=", 1)[1])
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    stop_on_signals(grace_s + 10)
    base = keep or Path(tempfile.mkdtemp(prefix="curio-soak-"))
    base.mkdir(parents=True, exist_ok=True)
    command = (*(MAKE_RUN if make_run else DVC_REPRO), *((target,) if target else ()))
    how = "python -m pipeline.orchestration.run_dvc" if make_run else "dvc repro"
    print(f"soak: {interruptions} interruptions, seed {seed}, each run `{how}`, in {base}", flush=True)
    try:
        # both runs in the same directory, one after the other: paths written into outputs (a Trainer's saved
        # arguments) are the same
        with open(base / "uninterrupted.log", "w") as log:
            print("uninterrupted run:", flush=True)
            durations, straight_s = uninterrupted(project(base / "run", overrides), log, command)
        straight = (base / "run").rename(base / "uninterrupted")
        soaked = project(base / "run", overrides) if not stages else reuse_upstream(straight, base / "run", stages)
        print(f"uninterrupted run: {straight_s:.0f} s; " + ", ".join(f"{s} {d:.0f} s" for s, d in durations.items()),
              flush=True)
        planned = plan(durations, interruptions, rng, kill_share, stages)
        print("interrupted run:", flush=True)
        with open(base / "interrupted.log", "w") as log:
            repairs: list[str] = []
            done, soak_s, problems = soak(soaked, durations, planned, rng, grace_s, log, repairs, command, stages)
        lost, differences = compare(straight, soaked)
    finally:
        if keep is None:
            print(f"(removing {base}; --keep DIR keeps both projects)", flush=True)
            shutil.rmtree(base, ignore_errors=True)
    for line in summary(done, interruptions, durations, make_run, grace_s, lost, differences, (soak_s, straight_s),
                        repairs, problems):
        print(line)
    return 1 if lost or problems else 0


def summary(done: list[Interruption], interruptions: int, durations: dict[str, float], make_run: bool,
            grace_s: float, lost: int, differences: list[str], times: tuple[float, float], repairs: list[str],
            problems: list[str]) -> list[str]:
    """What the soak prints at its end: the interruptions by signal and stage, how SIGTERMed stages stopped, rows
    lost, the outputs that differ, the time against the uninterrupted run's, repairs and problems."""
    by = Counter((i.signal.name, i.stage) for i in done)
    lines = [f"\ninterruptions survived: {len(done)} of {interruptions} planned "
             f"({sum(1 for i in done if i.signal == signal.SIGKILL)} SIGKILL, "
             f"{sum(1 for i in done if i.signal == signal.SIGTERM)} SIGTERM)",
             f"{'stage':<20} {'SIGKILL':>8} {'SIGTERM':>8}"]
    lines += [f"{stage:<20} {by[('SIGKILL', stage)]:>8} {by[('SIGTERM', stage)]:>8}" for stage in durations]
    if make_run:
        copies = Counter(i.signal.name for i in done if i.in_copy)
        lines.append(f"in a warm start's copy when interrupted: {sum(copies.values())} of {len(done)} "
                     f"({copies['SIGKILL']} SIGKILL, {copies['SIGTERM']} SIGTERM); the others ran in their own process "
                     "(not a `curio` command, declined by the server, or its server had died)")
    terms = [i for i in done if i.signal == signal.SIGTERM]
    if terms:
        exits = Counter(i.stage_exit for i in terms)
        lines.append(f"SIGTERM, the stage's exit: {dict(exits)} (143 stopped; 0 its work was done; -15 Python starting "
                     f"or exiting; None no stage process, or one DVC had reaped); slowest stop "
                     f"{max(i.stopped_s for i in terms):.1f} s (grace {grace_s:.0f} s)")
    lines.append(f"rows lost: {lost} (goal 0)")
    lines.append("outputs: identical to the uninterrupted run" if not differences else "outputs that differ:")
    lines += differences
    soak_s, straight_s = times
    lines.append(f"time: {soak_s:.0f} s interrupted vs {straight_s:.0f} s uninterrupted "
                 f"(overhead {soak_s - straight_s:+.0f} s, {soak_s / straight_s - 1:+.0%})")
    lines += [f"dvc.lock repaired (DVC rewrites it in place; `make run` repairs it itself): {r}" for r in repairs]
    return lines + [f"problem: {p}" for p in problems]
