"""A warm start for the commands ``dvc repro`` runs under ``make run``: the client side.

A stage process spends seconds loading torch, transformers and the stage's code before its work starts (about 6 s
for a training stage on a 2-core machine), and ``make run`` starts nineteen of them. Under ``make run``
(``pipeline.orchestration.run_dvc``) one process, :mod:`pipeline.stage_server`, loads all of that once; each ``curio``
command DVC runs then asks it for a copy of itself (``fork``) to run the command in, and waits for it. The copy runs
with this process's arguments, environment, working directory, standard input, output and error, so DVC sees what it
would have seen: the same output, the same exit code. A command that starts while the server is still loading (the first
stages of a run, the stage a resumed run starts with) waits for it, as it would otherwise spend the same seconds
loading the same libraries itself, beside the server, on the same cores. This process stays the one DVC knows:
SIGTERM, SIGINT and SIGHUP sent to it go on to the copy (which saves its progress and stops,
:mod:`pipeline.core.interrupt`), it exits with the copy's exit code, and a SIGKILL of it ends the copy too.

It is used only where it cannot change a result: under ``dvc repro`` (``$DVC_STAGE``), with the server's socket in
``$CURIO_WARM_SOCKET``, and with the environment the server loaded its libraries in (a variable that differs, other
than DVC's, the shell's and the warm start's own: the server declines, and the command loads everything itself, as
without the server). ``CURIO_WARM=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from pipeline.core.interrupt import stop_when_launcher_dies

SOCKET_ENV = "CURIO_WARM_SOCKET"
ENABLE_ENV = "CURIO_WARM"  # "0": run_dvc starts no server, and every command loads its own libraries
# The copy reports that it runs within this many seconds of the server taking the request (milliseconds, usually);
# past it the command gives up on the copy and loads everything itself.
START_TIMEOUT_S = 30.0
# A command waits this long at most for a server that is still loading (6-10 s on a 2-core machine), then loads
# everything itself.
LOAD_TIMEOUT_S = 120.0
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def wanted() -> bool:
    """Whether this command should ask the server: under ``dvc repro`` with a server to ask."""
    return bool(os.environ.get(SOCKET_ENV)) and "DVC_STAGE" in os.environ and os.environ.get(ENABLE_ENV, "1") != "0"


def loading_lock(path: str) -> str:
    """The file the server holds locked (``flock``) while it loads, beside its socket ``path``: a command that finds
    it locked and no socket waits; unlocked (loaded, or the server gone) it connects or runs itself."""
    return path + ".loading"


def start_server(path: str, **popen: object) -> subprocess.Popen:
    """Start :mod:`pipeline.stage_server` on the socket ``path``, its loading lock taken before it starts (a command
    that comes a moment later waits for it) and held by the server alone until it has bound its socket or died."""
    fd = os.open(loading_lock(path), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return subprocess.Popen([sys.executable, "-m", "pipeline.stage_server", path, "--loading-fd", str(fd)],
                                pass_fds=(fd,), **popen)
    finally:
        os.close(fd)  # the server's copy of it holds the lock now


def _wait_for_server(path: str, timeout_s: float = LOAD_TIMEOUT_S) -> bool:
    """Wait while the server holds its loading lock; whether it let go (bound its socket, or died) in time."""
    try:
        fd = os.open(loading_lock(path), os.O_RDONLY)
    except OSError:  # no server started on this path
        return True
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.02)
    finally:
        os.close(fd)


def _lines(conn: socket.socket):
    """The server's answers, one JSON object per line, until it closes the connection."""
    buf = b""
    while True:
        chunk = conn.recv(4096)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield json.loads(line)


def delegate() -> int | None:
    """Run this command in a copy of the server; its exit code, or None when the server declined or could not be
    reached (the caller then runs the command itself)."""
    try:  # before the socket, which would take a closed stream's number
        for fd in (0, 1, 2):
            os.fstat(fd)
    except OSError:  # a standard stream closed: nothing to pass for it
        return None
    stop_when_launcher_dies()  # DVC killed: SIGTERM here (passed on to the copy once there is one), as `curio stage`
    path = os.environ[SOCKET_ENV]
    if not os.path.exists(path) and not _wait_for_server(path):
        print(f"curio: the warm start was still loading after {LOAD_TIMEOUT_S:.0f} s; loading everything here",
              file=sys.stderr, flush=True)
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError:  # the server gone (it binds once it has loaded everything), or none started
        conn.close()
        return None
    worker: list[int] = []
    pending: list[int] = []

    def forward(signum: int, _frame: object = None) -> None:
        if worker:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker[0], signum)
        else:
            pending.append(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    code = None
    try:
        code = _ask(conn, worker, pending, forward)
        return code
    finally:
        conn.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
        if code is None and pending:  # a stop asked for before anything ran: this process stops instead
            os.kill(os.getpid(), pending[0])


def _ask(conn: socket.socket, worker: list[int], pending: list[int], forward: Callable[[int], None]) -> int | None:
    """Send the request; the copy's exit code, or None when the command should run here."""
    request = {"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd(), "prefix": sys.prefix}
    try:
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
    except OSError:  # the server gone
        return None
    conn.settimeout(START_TIMEOUT_S)
    started = False
    try:
        for answer in _lines(conn):
            if "declined" in answer:
                print(f"curio: the warm start declined ({answer['declined']}); loading everything here",
                      file=sys.stderr, flush=True)
                return None
            if "pid" in answer:
                worker.append(answer["pid"])
                for signum in pending:
                    forward(signum)
            if answer.get("started"):
                started = True
                conn.settimeout(None)  # from now on the command's own time
            if "code" in answer:
                return int(answer["code"])
    except TimeoutError:
        if worker:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker[0], signal.SIGKILL)
        print(f"curio: the warm start did not start in {START_TIMEOUT_S:.0f} s; loading everything here",
              file=sys.stderr, flush=True)
        return None
    if not started:  # the server went away before running anything
        return None
    print("curio: the warm start server ended without the command's exit code", file=sys.stderr, flush=True)
    return 1
