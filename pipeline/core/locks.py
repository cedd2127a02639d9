"""One writer per output: a second ``curio stage X`` (or ``curio pipeline``) on outputs another process is writing
is refused at once, in one line naming that process, or waits for it when asked (``--wait``, ``$CURIO_WAIT=1``).

Each output (``data/NAME`` of a stage declaration, mapped into ``data_dir``) has a lock file
``DATA_DIR/.locks/NAME.lock`` held with ``flock`` (the ``filelock`` package) for as long as a stage writes it: the
kernel releases it when the process ends, however it ends (SIGKILL included), so a lock is never left stale. Beside
it, ``NAME.owner`` says who holds it (pid, command, since when), for the refusal's message. DVC's own lock covers
``dvc repro``; these cover Curio's entry points (``curio stage``, ``curio pipeline``, the Prefect flows), whichever
runs them. A lock lives in ``data_dir``, so two runs writing other data directories (an overridden Prefect run's
workspace, ``curio logo``) never wait for each other.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

from filelock import FileLock, Timeout

from pipeline.core.artifacts import atomic_write_json
from pipeline.core.errors import CurioError

LOCK_DIR = ".locks"  # under data_dir: DVC tracks its stage outs one by one, never data/ itself
WAIT_ENV = "CURIO_WAIT"  # "1": wait for a running writer instead of refusing (what --wait sets)


class Busy(CurioError):
    """Another process holds the lock of an output this run would write."""


def lock_name(out: str) -> str:
    """A lock file's name for an output path relative to ``data_dir`` (``train_policy/sft`` → ``train_policy+sft``)."""
    return out.strip("/").replace("/", "+") or "data"


def waiting() -> bool:
    return os.environ.get(WAIT_ENV, "") not in ("", "0", "false")


def holder(lock_dir: Path, name: str) -> str:
    """Who holds ``name``'s lock, in words (pid and command), from its owner file."""
    try:
        owner = json.loads((lock_dir / f"{name}.owner").read_text())
        since = time.strftime("%H:%M:%S", time.localtime(owner["since"]))
        return f"pid {owner['pid']}: {owner['command']}, since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def _command() -> str:
    argv = [Path(sys.argv[0]).name if i == 0 else a for i, a in enumerate(sys.argv)] if sys.argv else []
    if argv and argv[0] in ("cli.py", "__main__.py", "-m", "-c"):
        argv[0] = "curio"
    text = " ".join(argv) or "python"
    return text if len(text) <= 160 else text[:157] + "..."


@contextmanager
def hold(data_dir: str | Path, outs: list[str], what: str, wait: bool | None = None) -> Iterator[None]:
    """Hold the lock of every output in ``outs`` (paths relative to ``data_dir``) while the block runs.

    Taken in sorted order (two runs waiting for each other's outputs cannot deadlock). A lock another process
    holds: :class:`Busy` naming it (exit 2), or, with ``wait`` (default: ``$CURIO_WAIT``), one line saying whom
    this run waits for, then the wait."""
    wait = waiting() if wait is None else wait
    lock_dir = Path(data_dir) / LOCK_DIR
    lock_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        for name in sorted({lock_name(o) for o in outs}):
            lock = FileLock(lock_dir / f"{name}.lock")
            try:
                lock.acquire(timeout=0)
            except Timeout:
                who = holder(lock_dir, name)
                if not wait:
                    raise Busy(f"{what}: {name} is being written by another run ({who}); wait for it to finish, "
                               f"or rerun with --wait") from None
                print(f"curio: {what}: waiting for {who}, which is writing {name}", file=sys.stderr, flush=True)
                lock.acquire()
            stack.callback(lock.release)
            owner = lock_dir / f"{name}.owner"
            atomic_write_json(owner, {"pid": os.getpid(), "command": _command(), "since": time.time()})
            stack.callback(lambda owner=owner: _forget(owner))
        yield


def _forget(owner: Path) -> None:
    with suppress(OSError):
        owner.unlink()
