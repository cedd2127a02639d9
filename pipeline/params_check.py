"""The ``check-params`` stage: every param checked before DVC touches any stage's outputs.

``dvc repro`` (and ``dvc exp run``) deletes a changed stage's outputs, then runs its command. A param the
command then refuses (``dvc exp run -S policy.model=./nope``) would already have cost those outputs. So
``check-params`` is the first node of the DAG: it depends on every params section, every other stage depends on
its stamp ``data/params.ok``, and DVC runs it (cheaply: the params load and ``check_params``) before anything
else. Its stamp is ``persist: true`` (a failed check deletes nothing) and its content never changes, so a
passing check never makes a downstream stage rerun: each stage still reruns only when its own params change.

Inside ``dvc exp run`` a refused experiment also gives back params.yaml: DVC wrote the ``-S`` values into it,
and when the refused key is the only difference from the experiment's baseline commit
(``$DVC_EXP_BASELINE_REV``) the file is restored from that commit, so ``git status`` is as before.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.config import ConfigError
from pipeline.core.stage import PARAMS_CHECK, PARAMS_STAMP
from pipeline.params import load_params

NAME, STAMP = PARAMS_CHECK, PARAMS_STAMP  # its stamp is a dep of every other stage (Stage.deps)
STAMP_TEXT = "params.yaml passed `curio check-params` (pipeline/params_check.py)\n"
BASELINE_ENV = "DVC_EXP_BASELINE_REV"  # set by DVC in the commands of `dvc exp run`


def check(params_file: str | Path = "params.yaml") -> Path:
    """Load and check every param (raises ConfigError, one line); write the stamp, always the same bytes."""
    from pipeline.core.artifacts import atomic_write_bytes

    params = load_params(params_file)
    stamp = params.data_path(Path(STAMP).name)
    if not stamp.is_file() or stamp.read_text() != STAMP_TEXT:
        atomic_write_bytes(stamp, STAMP_TEXT.encode())
    return stamp


def _leaves(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict) and d:
        return {k: v for name, sub in d.items() for k, v in _leaves(sub, f"{prefix}{name}.").items()}
    return {prefix.rstrip("."): d}


def rejected_key(error: ConfigError) -> str | None:
    """The dotted key a ConfigError names (``params: KEY: why``)."""
    text = str(error)
    if not text.startswith("params: "):
        return None
    key = text.removeprefix("params: ").split(":", 1)[0]
    return key if key and " " not in key else None


def restore_refused_experiment(error: ConfigError, params_file: str | Path = "params.yaml") -> str | None:
    """In ``dvc exp run``: params.yaml back to the baseline commit's when the refused key is all that differs.
    Returns a note for the user (what was done, or why not); None outside an experiment."""
    rev = os.environ.get(BASELINE_ENV)
    key = rejected_key(error)
    if not rev or not key:
        return None
    path = Path(params_file)
    res = subprocess.run(["git", "show", f"{rev}:{path.as_posix()}"], capture_output=True, text=True)
    if res.returncode != 0:
        return None
    try:
        base, mine = _leaves(yaml.safe_load(res.stdout) or {}), _leaves(yaml.safe_load(path.read_text()) or {})
    except yaml.YAMLError:
        return None
    differ = {k for k in base.keys() | mine.keys() if base.get(k, ...) != mine.get(k, ...)}
    if not differ or not all(k == key or k.startswith(key + ".") or key.startswith(k + ".") for k in differ):
        return f"{path} keeps the experiment's values (`git checkout {path}` undoes them)"
    path.write_text(res.stdout)
    return f"{path} restored"


def main(params_file: str | Path = "params.yaml") -> Path:
    """``curio check-params``: :func:`check`; a refused experiment's params.yaml restored (see module doc)."""
    try:
        return check(params_file)
    except ConfigError as e:
        note = restore_refused_experiment(e, params_file)
        raise ConfigError(f"{e}; nothing was run ({note})" if note else str(e)) from None
