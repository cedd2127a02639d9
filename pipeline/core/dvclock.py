"""A ``dvc.lock`` that a kill left unreadable, and its repair.

DVC rewrites ``dvc.lock`` in place (it opens the file for writing and dumps the YAML into it) after every stage it
runs. A ``dvc repro`` killed in that moment (a preemption, the OOM killer, a supervisor's SIGKILL to the process
group) leaves the file empty or cut short, and every later DVC command stops at "'./dvc.lock' validation failed".
The 100-interruption soak (``curio soak``) met it once: a SIGKILL 0.9 s into the run, as DVC recorded its first stage.

- :func:`keep` runs as each ``curio stage`` starts under ``dvc repro``: the ``dvc.lock`` DVC has just read and
  validated is copied (atomically) to ``.dvc/tmp/curio/dvc.lock``.
- :func:`repair` (``curio repair-lock``, and ``make run`` before its ``dvc repro``) leaves a valid ``dvc.lock`` alone;
  an unreadable one is moved to ``dvc.lock.broken`` and the kept copy put in its place, or none when there is no
  kept copy. Either is safe: DVC skips a stage only when its lock entry matches the files on disk, so ``dvc repro``
  reruns the stages the copy does not record, and each resumes from its saved data (resumable outputs are
  ``persist: true``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import yaml

from pipeline.core.artifacts import atomic_write_bytes

LOCK = "dvc.lock"
KEPT = Path(".dvc") / "tmp" / "curio" / LOCK
BROKEN = "dvc.lock.broken"


def readable(path: Path) -> bool:
    """``path`` is a lock file DVC accepts (its own schema), or it does not exist."""
    if not path.exists():
        return True
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError):
        return False
    if not isinstance(data, dict):
        return False
    from dvc.schema import COMPILED_LOCKFILE_SCHEMA  # DVC's own check (its import costs a second: repairs only)

    try:
        COMPILED_LOCKFILE_SCHEMA(data)
    except Exception:  # voluptuous's Invalid and its subclasses
        return False
    return True


def keep(root: str | Path | None = None) -> Path | None:
    """Copy ``ROOT/dvc.lock`` to ``ROOT/.dvc/tmp/curio/dvc.lock`` (ROOT: DVC's ``DVC_ROOT``, set for a stage's
    command; DVC read and checked the file before starting the stage); the copy, or None."""
    root = root or os.environ.get("DVC_ROOT")
    if not root:
        return None
    kept = Path(root) / KEPT
    try:
        atomic_write_bytes(kept, (Path(root) / LOCK).read_bytes())
    except OSError:  # DiskFull too
        return None  # a copy is a convenience: never fail a stage for it
    return kept


def repair(root: str | Path = ".") -> str | None:
    """Repair ``ROOT/dvc.lock`` if it is unreadable; a line saying what was done, or None when it was fine."""
    root = Path(root)
    lock, kept = root / LOCK, root / KEPT
    if readable(lock):
        return None
    shutil.move(lock, root / BROKEN)
    if kept.exists() and readable(kept):
        atomic_write_bytes(lock, kept.read_bytes())
        done = (f"restored the copy kept when the last stage started ({KEPT}): `dvc repro` reruns the stages it "
                "does not record")
    else:
        done = "no copy was kept: `dvc repro` reruns every stage"
    return (f"{LOCK} was unreadable (a run stopped while DVC wrote it; moved to {BROKEN}); {done}, each resuming "
            "from its saved data")
