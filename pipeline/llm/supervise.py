"""Run one server command so that it never outlives the process that asked for it.

    python pipeline/llm/supervise.py COMMAND...

Run by path with any Python (standard library only): it starts COMMAND in a process group of its own and
waits. When the process that started this one dies, however it dies (SIGKILL included: the supervisor polls
its parent), or when this process gets SIGTERM / SIGINT, the whole group gets SIGTERM, then SIGKILL after
``$CURIO_SUPERVISE_GRACE_S`` (default 20 s). A second SIGTERM / SIGINT kills the group at once, as a second Ctrl-C
does: a vLLM server that is still loading its model ignores SIGTERM until it is up (~20 s on a CPU), and one that
never served has nothing to finish. A server such as vLLM's starts engine processes of its own; they are in that
group, so they go with it. Exits with COMMAND's code when COMMAND ends by itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

POLL_S = 0.25


def stop_group(child: subprocess.Popen, grace_s: float, hurry: Callable[[], bool] = lambda: False) -> None:
    """SIGTERM the child's group, then SIGKILL whatever of it is left after ``grace_s``, or as soon as ``hurry()``."""
    pgid = child.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not hurry():
        child.poll()  # reap it: a zombie still counts as a member of its group
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(POLL_S)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: supervise.py COMMAND...", file=sys.stderr)
        return 2
    grace_s = float(os.environ.get("CURIO_SUPERVISE_GRACE_S", "20"))
    parent = os.getppid()
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stop.append(signum))
    signal.signal(signal.SIGINT, lambda signum, _frame: stop.append(signum))
    child = subprocess.Popen(argv, start_new_session=True)  # its own group: every process it starts goes with it
    while True:
        code = child.poll()
        if code is not None:
            stop_group(child, 1.0)  # helpers it left behind
            return code
        if stop or os.getppid() != parent:  # asked to stop, or the launcher is gone (we were re-parented)
            stop_group(child, grace_s, hurry=lambda: len(stop) > 1)
            child.wait()
            return 128 + (stop[0] if stop else signal.SIGTERM)
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
