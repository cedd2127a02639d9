"""The warm start's server: torch, transformers, TRL and Curio's code loaded once, a copy per command DVC runs.

    python -m pipeline.stage_server SOCKET [--loading-fd FD]   # `make run` (pipeline.orchestration.run_dvc) starts it

It loads what the stages load (:data:`PRELOAD`, every module of ``pipeline`` and ``stages``), then listens on the
Unix socket ``SOCKET``, bound only once everything is loaded. Until then it holds the lock on ``FD``
(:func:`pipeline.core.warm.start_server` takes it for it), and a command that starts meanwhile waits for the socket;
it loads its own libraries, as without the server, when the server dies first. For each request (a ``curio`` command
under ``dvc repro``, :mod:`pipeline.core.warm`) it forks a *manager*, which forks the *copy* that runs the command
and reports the copy's exit code back. The copy takes the command's standard input, output and error (passed over
the socket), working directory, arguments and environment, and runs ``curio`` (``pipeline.cli``) as the command
would have; the libraries it would have loaded are loaded already, with the same environment: a request whose
environment differs in anything the libraries may read while loading is declined (:data:`PER_COMMAND` lists what may
differ).

Processes, for ``ps`` and for signals:
- the server ignores SIGINT (``make run``'s process stops it) and dies of SIGTERM or of its parent's death;
- a manager blocks SIGTERM, SIGINT and SIGHUP (the copy gets them and saves its progress); when the command's
  process ends without the exit code (SIGKILL), it kills the copy, so a killed command leaves nothing running;
- the copy dies with its manager (PR_SET_PDEATHSIG), and is in the process group of ``make run``, as a stage
  process started by DVC is.

Forking is safe here because the server runs one Python thread when it forks (it checks, and serves nothing
otherwise); the native threads of OpenBLAS and of pyarrow's jemalloc that loading starts handle ``fork`` themselves,
as they do for torch's DataLoader workers.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import pkgutil
import random
import select
import signal
import socket
import sys
import threading
import time

from pipeline.core.interrupt import signal_on_parent_death
from pipeline.core.warm import FORWARDED, SOCKET_ENV
from pipeline.nethack.clock import preload, preload_env

VERBOSE_ENV = "CURIO_WARM_VERBOSE"  # "1": the server says when it is ready, and how long loading took

# What the stages load beyond Curio's own modules: torch (2 s on a 2-core machine), transformers with its Trainer
# (4 s), TRL. The others a stage loads (sample-factory, NLE, datasets, pandas) come with Curio's modules.
PRELOAD = ("torch", "transformers", "transformers.trainer", "trl")
# Curio's modules that are not loaded: Prefect's flows (not run under dvc repro) and this module.
SKIP = ("pipeline.orchestration.flows", "pipeline.orchestration.flow_workspace", "pipeline.stage_server")
# Variables a request may differ in: DVC's own (DVC_STAGE, DVC_ROOT, ...), the shell's and the warm start's. DVC
# runs a command with `$SHELL -c`, and bash then drops the prompts PS1 and PS2 and resets PS4 (a virtualenv's
# `activate` exports PS1): no library reads them.
PER_COMMAND = ("PWD", "OLDPWD", "SHLVL", "_", "PS1", "PS2", "PS4", SOCKET_ENV, VERBOSE_ENV)


def _per_command(name: str) -> bool:
    return name.startswith("DVC_") or name in PER_COMMAND


def load() -> list[str]:
    """Import :data:`PRELOAD` and every module of ``pipeline`` and ``stages``; the ones that failed to import."""
    import pipeline
    import stages

    failed = []
    names = list(PRELOAD) + ["pipeline.cli"]
    for package in (pipeline, stages):
        names += [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
                  if not m.name.startswith(SKIP)]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional extra not installed: the command that needs it says so
            failed.append(name)
    return failed


class Server:
    def __init__(self, path: str) -> None:
        self.path = path
        self.environ = dict(os.environ)  # what the libraries loaded with (after NetHack's clock re-execution)
        self.added: dict[str, str] = {}
        self.failed: list[str] = []

    def ready(self) -> socket.socket | None:
        """Load everything, then bind and listen; None when it cannot serve (a Python thread was started)."""
        self.failed = load()
        self.added = {k: v for k, v in os.environ.items() if self.environ.get(k) != v}
        gc.freeze()  # what is loaded stays out of the copies' garbage collections (which would also copy its pages)
        if threading.active_count() != 1:
            names = ", ".join(t.name for t in threading.enumerate() if t is not threading.current_thread())
            print(f"curio: the warm start serves nothing: loading started Python threads ({names})", file=sys.stderr)
            return None
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path + ".tmp")
        listener.listen(64)
        os.rename(self.path + ".tmp", self.path)  # appears when it answers
        return listener

    def serve(self, listener: socket.socket) -> tuple[socket.socket, dict, list[int]]:
        """Accept requests forever; returns only in a copy, with its request (the caller runs it)."""
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # managers are reaped as they end
        while True:
            conn, _ = listener.accept()
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                listener.close()
                return self.manage(conn)
            conn.close()

    def _declined(self, request: dict) -> str | None:
        """Why the request cannot run in a copy, or None."""
        if os.path.realpath(request.get("prefix", "")) != os.path.realpath(sys.prefix):
            return f"another Python environment ({request.get('prefix')})"
        env = preload_env(request["env"])
        for name in sorted(set(env) | set(self.environ)):
            if not _per_command(name) and env.get(name) != self.environ.get(name):
                return f"${name} differs from the server's"
        return None

    def manage(self, conn: socket.socket) -> tuple[socket.socket, dict, list[int]]:
        """The manager: read the request, fork the copy, wait for it and send its exit code (or kill it when the
        command's process is gone). Returns only in the copy."""
        # blocked, not ignored: one that comes before the copy has its handlers waits for them (the copy unblocks)
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        while not data.endswith(b"\n"):
            chunk = conn.recv(1 << 16)
            if not chunk:
                os._exit(0)
            data += chunk
        request = json.loads(data)
        if reason := self._declined(request):
            conn.sendall(json.dumps({"declined": reason}).encode() + b"\n")
            os._exit(0)
        pid = os.fork()
        if pid == 0:
            return conn, request, fds
        for fd in fds:
            os.close(fd)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        if os.environ.get(VERBOSE_ENV):
            command = " ".join(["curio", *request["argv"][1:]])
            print(f"curio: warm start: `{command}` runs in a copy (pid {pid})", file=sys.stderr, flush=True)
        pidfd = os.pidfd_open(pid)
        while True:
            ready, _, _ = select.select([conn, pidfd], [], [])
            if pidfd in ready:
                break
            if not conn.recv(64):  # the command's process died (SIGKILL): so does the copy
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"code": 128 - code if code < 0 else code}).encode() + b"\n")
        os._exit(0)

    def become(self, conn: socket.socket, request: dict, fds: list[int]) -> None:
        """The copy: take the command's streams, directory, environment and arguments."""
        signal_on_parent_death(signal.SIGKILL)
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        env = {**preload_env(request["env"]), **self.added}
        env.pop(SOCKET_ENV, None)  # the commands it starts load their own
        os.environ.clear()
        os.environ.update(env)
        sys.argv = list(request["argv"])
        random.seed()  # as a process of its own would be
        # buffered by line on a terminal, as Python starts it (-u / PYTHONUNBUFFERED: the server's, the same)
        sys.stdout.reconfigure(line_buffering=os.isatty(1))
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"started": True, "pid": os.getpid()}).encode() + b"\n")
        conn.close()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)


def main(argv: list[str]) -> None:
    preload()  # NetHack's clock library, as `curio` loads it (the process starts over once)
    loading = int(argv[2]) if argv[1:2] == ["--loading-fd"] else None  # held (flock) until the socket is bound
    if loading is not None:
        os.set_inheritable(loading, False)  # no process started while loading keeps the lock
    signal_on_parent_death(signal.SIGTERM)
    if os.getppid() == 1:  # make run's process died before this line
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    t0 = time.perf_counter()
    server = Server(argv[0])
    listener = server.ready()
    if loading is not None:
        os.close(loading)  # the commands waiting connect now (or, with no socket, load their own libraries)
    if listener is None:
        return
    if os.environ.get(VERBOSE_ENV):
        missing = f" (not loaded: {', '.join(server.failed)})" if server.failed else ""
        print(f"curio: warm start ready in {time.perf_counter() - t0:.1f} s{missing}", file=sys.stderr, flush=True)
    conn, request, fds = server.serve(listener)
    server.become(conn, request, fds)
    from pipeline.cli import app  # loaded already (by Server.ready): here only the name

    app(prog_name="curio")


if __name__ == "__main__":
    main(sys.argv[1:])
