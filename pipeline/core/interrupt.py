"""SIGTERM (or SIGINT) means "checkpoint now": a running stage stops at its next safe point, keeps what it finished,
and exits 128 + the signal's number (143 for SIGTERM) with one line saying where its rerun resumes.

:func:`stopping` (around every stage, :func:`pipeline.core.stage.execute`) turns the signal into a request; the
code that runs the work answers it at its safe points:

- :func:`check` raises :class:`Stopped` when a stop was asked for (after a chunk's part is written, after a round's
  checkpoint);
- a Hugging Face Trainer saves a checkpoint at the step it is on and stops (``pipeline.models.training``);
- :func:`on_stop` passes the request on to a child that checkpoints itself (sample-factory, ``accelerate launch``);
- :func:`at` names the point the run would resume at (``chunk 7 of 12 (data/rollout_text)``, ``round 2 of 3``),
  innermost last, for the line.

Work in flight that has not reached a safe point ``grace_s / 3`` before the grace period ends is dropped (the signal
is raised in the main thread: every write is atomic, so that costs what a kill would, and locks, clusters and the
MLflow run still close); at ``grace_s`` the process exits 143 whatever it is doing. A second signal changes nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import CurioError

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# libc's prctl, resolved at import: a child between fork and exec (a Popen preexec_fn) must not import or load
# anything (another thread of the parent may have held the import lock when it forked).
_PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1
DEFAULT_GRACE_S = 20.0  # under the 30 s Prefect (and most supervisors) wait before their SIGKILL


class Stopped(CurioError):
    """The stage stopped on a signal, its finished work kept; exit 128 + the signal's number."""

    def __init__(self, message: str, signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.exit_code = 128 + signum


@dataclass
class Point:
    """Where the run resumes, at one level (a round, a chunk, a training step); :func:`at` yields it."""

    text: str


@dataclass
class _State:
    stage: str = ""
    signum: int | None = None  # the signal that asked for the stop
    since: float = 0.0
    points: list[Point] = field(default_factory=list)
    left_at: str | None = None  # the points when an exception first left them (the stack unwinds before the line)
    callbacks: list[Callable[[int], None]] = field(default_factory=list)
    raised: bool = False  # Stopped raised already: the grace timers leave the unwinding alone
    depth: int = 0  # nested stopping() blocks (a stage inside `curio pipeline`)
    generation: int = 0  # one per outermost block: a timer of an earlier one does nothing
    grace_s: float | None = DEFAULT_GRACE_S
    # re-entrant: a second signal (DVC's death after a SIGTERM to the group) runs the handler again, in the same
    # thread, while the first one holds it
    lock: threading.RLock = field(default_factory=threading.RLock)


_STATE = _State()


def requested() -> int | None:
    """The signal that asked this process to stop, or None."""
    return _STATE.signum


def where() -> str:
    """Where a rerun resumes, from the innermost :func:`at` points (or what the last exception left)."""
    text = ", ".join(p.text for p in _STATE.points if p.text)
    return text or _STATE.left_at or "its finished parts and checkpoints"


def message() -> str:
    name = signal.Signals(_STATE.signum or signal.SIGTERM).name
    return f"stopped by {name}: {_STATE.stage or 'the run'} resumes at {where()}"


def stopped() -> Stopped:
    """The :class:`Stopped` to raise now (the stop's signal and line)."""
    _STATE.raised = True
    return Stopped(message(), _STATE.signum or signal.SIGTERM)


def grace_period() -> float | None:
    """The grace period of the running :func:`stopping` block (None outside one, or when its launcher bounds it):
    a child that checkpoints itself gets a part of it."""
    return _STATE.grace_s if _STATE.depth else None


def check() -> None:
    """Raise :class:`Stopped` if a stop was asked for: call it where the work done so far is saved."""
    if _STATE.signum is not None:
        raise stopped()


@contextlib.contextmanager
def at(text: str = "") -> Iterator[Point]:
    """Inside the block the run resumes at ``text`` (after the enclosing blocks' points); update ``point.text`` as
    work is saved."""
    point = Point(text)
    _STATE.points.append(point)
    try:
        yield point
    except BaseException:
        if _STATE.signum is not None and _STATE.left_at is None:
            _STATE.left_at = ", ".join(p.text for p in _STATE.points if p.text) or None
        raise
    finally:
        _STATE.points.remove(point)


@contextlib.contextmanager
def on_stop(callback: Callable[[int], None]) -> Iterator[None]:
    """Call ``callback(signum)`` when a stop is asked for while the block runs (at once if it was already): pass
    the signal on to a child process that saves its own work."""
    with _STATE.lock:
        _STATE.callbacks.append(callback)
        already = _STATE.signum
    if already is not None:
        _call(callback, already)
    try:
        yield
    finally:
        with _STATE.lock:
            _STATE.callbacks.remove(callback)


def _call(callback: Callable[[int], None], signum: int) -> None:
    with contextlib.suppress(OSError, ValueError):  # the child is gone already
        callback(signum)


def _ask(signum: int, _frame: object = None) -> None:
    """The signal handler: the first signal asks for a stop (and starts the grace period's timers)."""
    with _STATE.lock:
        if _STATE.signum is not None:
            return
        _STATE.signum, _STATE.since = signum, time.monotonic()
        callbacks = list(_STATE.callbacks)
    for callback in callbacks:
        _call(callback, signum)
    if _STATE.grace_s is not None:
        signal.setitimer(signal.ITIMER_REAL, max(0.1, _STATE.grace_s * 2 / 3))
        threading.Thread(target=_exit_at_deadline, args=(_STATE.grace_s, _STATE.generation), name="curio-grace",
                         daemon=True).start()


def _drop_in_flight(_signum: int, _frame: object) -> None:
    """SIGALRM, a third of the grace period before its end: what is still running is dropped."""
    if _STATE.signum is not None and not _STATE.raised:
        raise stopped()


def _exit_at_deadline(grace: float, generation: int) -> None:
    time.sleep(max(0.0, grace - (time.monotonic() - _STATE.since)))
    if _STATE.depth == 0 or _STATE.generation != generation:
        return  # the stopped block has ended: its caller exits
    print(f"curio: {message()}", file=sys.stderr, flush=True)
    os._exit(128 + (_STATE.signum or signal.SIGTERM))


def catch_early() -> None:
    """From now on SIGTERM / SIGINT are recorded, not fatal (a process still loading its libraries): the
    :func:`stopping` block that follows stops at once, before any work."""
    if threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            signal.signal(s, _note)


def _note(signum: int, _frame: object = None) -> None:
    if _STATE.signum is None:
        _STATE.signum, _STATE.since = signum, time.monotonic()


@contextlib.contextmanager
def stopping(stage: str, grace_s: float | None = DEFAULT_GRACE_S) -> Iterator[None]:
    """SIGTERM and SIGINT ask the block to stop (see the module's docstring); within it any error raised after the
    signal (a child process that got it too, a worker gone) is the stop, not a failure.

    ``grace_s``: the bound on the stop (None: no timers, for a process whose launcher bounds it). A nested block
    (a stage inside ``curio pipeline``) names its stage for its duration and puts the handlers back when another
    library replaced them (Prefect's flow engine does); the outermost block's grace period holds. Outside the main
    thread: nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer = _STATE.depth == 0
    previous = {s: signal.getsignal(s) for s in (*SIGNALS, signal.SIGALRM)}
    outer_stage = _STATE.stage
    early = outer and previous[signal.SIGTERM] is _note and _STATE.signum is not None  # (catch_early)
    if outer:
        _STATE.left_at, _STATE.raised, _STATE.grace_s = None, False, grace_s
        _STATE.signum = _STATE.signum if early else None
        _STATE.generation += 1
    _STATE.stage = stage
    _STATE.depth += 1
    for s in SIGNALS:
        signal.signal(s, _ask)
    signal.signal(signal.SIGALRM, _drop_in_flight)
    try:
        if early:  # the signal came while the process was starting: nothing of this block has run
            raise stopped()
        yield
    except Stopped:
        raise
    except BaseException as e:
        if _STATE.signum is None:
            raise
        raise stopped() from e
    finally:
        _STATE.depth -= 1
        _STATE.stage = outer_stage
        if outer:
            signal.setitimer(signal.ITIMER_REAL, 0)
            _STATE.signum = None
        for s, handler in previous.items():
            signal.signal(s, handler)


SHELLS = frozenset({"sh", "dash", "bash", "zsh", "ksh", "mksh", "fish"})


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (field 3 first), or None for a process that is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _identity(pid: int) -> tuple[int, str] | None:
    """(pid, start time): a pid the kernel reuses for another process later is another identity."""
    fields = _stat(pid)
    return None if fields is None or fields[0] == "Z" else (pid, fields[19])


def launcher_pid() -> int:
    """The process that launched this one: the parent, or the parent's parent when the parent is a shell that ran
    the command without exec'ing it (DVC runs a stage's cmd with ``$SHELL -c``, and dash, Debian's /bin/sh, forks
    for it)."""
    parent = os.getppid()
    try:
        argv = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return parent
    name = os.path.basename(argv[0].decode(errors="replace")).lstrip("-")
    if name in SHELLS and b"-c" in argv and (fields := _stat(parent)) is not None:
        return int(fields[1])
    return parent


def signal_on_parent_death(signum: int) -> None:
    """Have the kernel send this process ``signum`` when the thread that started it ends, however it ends (even
    SIGKILL): PR_SET_PDEATHSIG. Linux only; elsewhere nothing. Safe in a Popen ``preexec_fn``."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signum)


def stop_when_launcher_dies(poll_s: float = 0.5) -> None:
    """SIGTERM this process when the process that launched it dies: the kernel's PR_SET_PDEATHSIG for a direct
    parent, and a watching thread for a launcher behind a shell (its death leaves the shell running, which sends
    nothing). Linux only; elsewhere nothing changes."""
    if not sys.platform.startswith("linux"):
        return
    signal_on_parent_death(signal.SIGTERM)
    launcher = launcher_pid()
    if launcher == os.getppid() or (identity := _identity(launcher)) is None:
        return

    def watch() -> None:
        while _identity(launcher) == identity:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="curio-launcher-watch", daemon=True).start()
