"""The failures ``curio`` reports as one line, each with its exit code (anything else is a bug: a traceback).

Exit codes: 2 = bad params or bad / missing input (fix it and rerun), a full disk (free space and rerun: finished
work is kept), another run writing the same outputs (wait for it, or rerun with ``--wait``); 3 = the LLM server is
unavailable (start it or fix ``base_url``, then rerun: finished work is kept).
"""

from __future__ import annotations

import errno

#: The errnos of a full disk: no space left, or the user's quota used up.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
#: What libraries that do not raise an OSError say instead (SQLite: MLflow's store, the LLM cache).
_DISK_FULL_TEXTS = ("database or disk is full", "no space left on device", "disk quota exceeded")


class CurioError(Exception):
    """An expected failure; its message is one line and ``exit_code`` the code ``curio`` exits with."""

    exit_code = 2


class InputError(CurioError, FileNotFoundError):
    """A stage input is missing, corrupt or not what its manifest records; the message names what to rerun.

    Also a FileNotFoundError: code that treats a missing input as optional keeps working."""


class ServerUnavailable(CurioError):
    """Every request of a batch failed to reach the LLM server, after the backend's retries."""

    exit_code = 3


class TimedOut(CurioError):
    """A bounded step ran past its time limit (rl_nethack.timeout_s); it stopped at a checkpoint the rerun resumes."""

    exit_code = 4


class DiskFull(CurioError, OSError):
    """A write failed for want of space (ENOSPC / EDQUOT). Whatever was being written is not trusted (temp files,
    staging directories and unfinished checkpoints are dropped or ignored): after freeing space, the rerun resumes
    from the finished parts and checkpoints. Also an OSError, as the error it stands for."""

    @classmethod
    def at(cls, where: object | None = None) -> DiskFull:
        place = f" writing {where}" if where else ""
        return cls(f"disk full{place} (no space left on the device): free some space and rerun; finished work is "
                   "kept and the rerun resumes from it")


def _disk_full_here(e: BaseException) -> bool:
    if isinstance(e, DiskFull):
        return True
    if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
        return True
    if getattr(e, "sqlite_errorcode", None) == 13:  # SQLITE_FULL (sqlite3.OperationalError)
        return True
    text = str(e).lower()
    return any(t in text for t in _DISK_FULL_TEXTS)


def disk_full(e: BaseException) -> DiskFull | None:
    """The one-line :class:`DiskFull` for an exception that is, or was caused by, a full disk (following
    ``__cause__`` / ``__context__``, as libraries wrap the OSError); None for anything else."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if _disk_full_here(cur):
            if isinstance(cur, DiskFull):
                return cur
            return DiskFull.at(getattr(cur, "filename", None))
        cur = cur.__cause__ or cur.__context__
    return None
