"""NetHack's clock, pinned to a fixed date and time (``nethack.clock``).

NetHack reads the wall clock: a full or new moon and Friday the 13th change the hero's Luck and the opening
message, night changes monsters, and the hero's birth time (the start of each game) picks shopkeeper names. So
the same seeds would give other games on another date. NLE has no setting for it, so Curio interposes on the
four libc calls NetHack reads the date with (``time``, ``gettimeofday``, ``localtime``, ``mktime``): a small C
library (``clock.c``, built by ``make nethack-clock`` into the virtual env) loaded with ``LD_PRELOAD`` answers
them with the pinned instant when the caller is a NetHack library, and passes every other caller through —
Python's ``time.time`` / ``monotonic`` (``clock_gettime``), sample-factory's timing, sqlite, git stay real.

Why not libfaketime: it fakes every clock call of the process, ``clock_gettime`` included, so sample-factory's
FPS, timeouts and MLflow's timestamps would be fake too (frozen, or drifting from a start time — and a drifting
clock gives every episode another birth time, so other shopkeepers).

``LD_PRELOAD`` only takes effect when a process starts, so the processes that host NLE start with it:
:func:`preload` re-executes the current process with it set (``curio`` does so at start, the test suite and the
bench scripts too); child processes — ``dvc repro``'s stage commands, Prefect's, sample-factory's trainer and
workers — inherit it. :func:`pin` (called by every env Curio creates) sets the instant and fails with one line
(exit 2) when the library is not loaded, rather than letting a game run on the real clock.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from pipeline.core.errors import CurioError

#: The default: Monday 3 January 2000, noon — not a full or new moon, not Friday the 13th, not night.
DEFAULT_CLOCK = "2000-01-03 12:00:00"
FORMAT = "%Y-%m-%d %H:%M:%S"
LIBRARY_ENV = "CURIO_NETHACK_CLOCK_LIB"  # overrides where the library is looked for
_REEXEC_ENV = "CURIO_NETHACK_CLOCK_REEXEC"  # set on the re-executed process: never loop


class ClockError(CurioError):
    """NetHack would run on the real clock (the interposing library is not loaded), or the clock is malformed."""


def parse(clock: str) -> int:
    """Seconds since the epoch of ``YYYY-MM-DD HH:MM:SS``, read as the game's local time."""
    try:
        return int(datetime.strptime(clock, FORMAT).replace(tzinfo=UTC).timestamp())
    except ValueError:
        raise ClockError(f"nethack.clock: {clock!r} is not a date and time 'YYYY-MM-DD HH:MM:SS'") from None


def library_path() -> Path:
    """Where ``make nethack-clock`` puts the library (``$CURIO_NETHACK_CLOCK_LIB`` overrides)."""
    return Path(os.environ.get(LIBRARY_ENV) or Path(sys.prefix) / "lib" / "curio_nethack_clock.so")


# The compiler flags of the Makefile's `nethack-clock` recipe (tests/test_nethack_clock.py holds the two together).
CFLAGS = ("-O2", "-shared", "-fPIC", "-Wall", "-Wno-nonnull-compare")


def compile_library(source: Path, out: Path) -> Path:
    """Compile ``source`` (a clock.c) into the library ``out``, as ``make nethack-clock`` does (for the bench scripts
    that build another checkout's or revision's)."""
    import subprocess

    subprocess.run([os.environ.get("CC", "gcc"), *CFLAGS, "-o", str(out), str(source), "-ldl"], check=True)
    return out


def _loaded() -> ctypes.CDLL | None:
    """The library, when it is loaded in this process (LD_PRELOAD puts its symbols in the global scope)."""
    process = ctypes.CDLL(None)
    try:
        process.curio_nethack_clock_set  # noqa: B018 — the lookup is the check
    except AttributeError:
        return None
    process.curio_nethack_clock_set.argtypes = [ctypes.c_longlong]
    process.curio_nethack_clock_get.restype = ctypes.c_longlong
    return process


def preloaded() -> bool:
    return _loaded() is not None


def preload() -> None:
    """Re-execute this process with the library in ``LD_PRELOAD`` (once), unless it is loaded already or not built.

    Call it first thing in an entry point: the process starts over, so nothing done before survives. A library
    that is not built is not an error here — :func:`pin` says so when an env is made.
    """
    if preloaded():
        return
    env = preload_env(os.environ)
    if env == os.environ:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def preload_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment :func:`preload` starts the process over with (``env`` itself when it would not): the
    library in ``LD_PRELOAD``, once."""
    env = dict(env)
    library = library_path()
    if env.get(_REEXEC_ENV) or sys.platform != "linux" or not library.is_file():
        return env
    env["LD_PRELOAD"] = " ".join(filter(None, [str(library.resolve()), env.get("LD_PRELOAD")]))
    env[_REEXEC_ENV] = "1"
    return env


def pin(clock: str) -> int:
    """Pin NetHack's clock in this process to ``clock``; returns the instant (seconds since the epoch).

    Raises :class:`ClockError` when the library is not loaded: a game must never silently run on the real clock.
    """
    seconds = parse(clock)
    process = _loaded()
    if process is None:
        where = library_path()
        hint = "build it with `make nethack-clock`" if not where.is_file() else \
            "start NetHack through `curio` (or LD_PRELOAD it)"
        raise ClockError(f"NetHack's clock cannot be pinned: {where} is not loaded in this process; {hint}")
    process.curio_nethack_clock_set(seconds)
    return seconds


def pinned() -> int | None:
    """The instant NetHack's clock is pinned to in this process, or None."""
    process = _loaded()
    if process is None:
        return None
    value = int(process.curio_nethack_clock_get())
    return None if value < 0 else value
