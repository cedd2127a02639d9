"""DVC's own API, in this process: which stages ``dvc status`` flags, and ``dvc commit --force`` of finished ones.

The Prefect ``pipeline`` flow asks before each stage whether DVC holds it current, and records each stage it ran
(``pipeline.orchestration.flows``); as ``dvc`` commands that was two processes a stage, each loading DVC (~1.3 s each on
a 2-core machine, most of a stage's bookkeeping when it resumes to completion). :class:`dvc.repo.Repo` answers the same
questions, with the same lock on the repository, opened anew for each so it reads what the stages just wrote.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def _repo() -> Iterator:
    """The repository the working directory is in (stage names are its ``dvc.yaml``'s), opened for one question.

    DVC's lines of progress ("Updating lock file ...") are its CLI's: here only its warnings and errors are shown, on
    this process's stderr as it is now (the handlers ``import dvc`` installs hold the streams of that moment)."""
    from dvc.repo import Repo

    log = logging.getLogger("dvc")
    handlers, level, propagate = log.handlers[:], log.level, log.propagate
    log.handlers, log.propagate = [logging.StreamHandler(sys.stderr)], False
    log.setLevel(logging.WARNING)
    try:
        with Repo() as repo:
            yield repo
    finally:
        log.handlers, log.propagate = handlers, propagate
        log.setLevel(level)


def status(targets: list[str] | None = None) -> dict | None:
    """``dvc status --json [TARGETS]``: the stages it flags (changed or never run), each with what changed; None
    when DVC cannot tell (no repository, an unreadable ``dvc.lock`` or ``dvc.yaml``)."""
    from dvc.exceptions import DvcException

    try:
        with _repo() as repo:
            return repo.status(targets=targets or None)
    except DvcException:
        return None


def current(name: str) -> bool:
    """DVC holds stage ``name`` current: ``dvc repro`` would skip it."""
    flagged = status([name])
    return flagged is not None and name not in flagged


def commit(names: list[str]) -> None:
    """``dvc commit --force NAMES``: ``dvc.lock`` records the stages as run, as ``dvc repro`` would after running
    them; raises ``RuntimeError`` with DVC's message when it cannot."""
    from dvc.exceptions import DvcException

    try:
        with _repo() as repo:
            for name in names:
                repo.commit(name, force=True)
    except DvcException as e:
        raise RuntimeError(f"dvc commit {' '.join(names)} failed: {e}") from e
