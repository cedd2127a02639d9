"""One resume idiom for every trained artefact: checkpoints belong to a run key, and only that key resumes them.

A training run is identified by :func:`run_key` — its params slice's hash followed by the content hashes of its
inputs. Its checkpoints go into :func:`keyed_dir`, which empties a directory left by another key (a params
change, new data, another init model), so a stale checkpoint is never resumed, and keeps one of the same key,
so a killed run continues where it stopped. The libraries do the resuming in that directory: TRL / HF
``Trainer(resume_from_checkpoint=...)`` (bootstrap, train-sft, train-dpo, rl-text's filtered BC), ArCHer's
round checkpoints (rl-text archer / chai), sample-factory's own experiment directory (rl-nethack). A finished
model carries its key (:func:`mark_finished`), so a rerun of the same key skips training.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.core.artifacts import atomic_write_bytes

KEY_FILE = "KEY"  # in a checkpoint directory: the run key its checkpoints were written under
DONE_FILE = "DONE"  # in a finished model directory: the run key it was trained under


def run_key(params_hash: str, *inputs: str) -> str:
    """The identity of one training run: its params slice's hash, then its inputs' content hashes."""
    return params_hash + "".join(inputs)


def keyed_dir(root: Path, key: str, marker: str = KEY_FILE) -> Path:
    """``root``, holding only checkpoints of ``key``: emptied first when it was written under another key (or
    under none), kept as it is when it was written under ``key`` (the run resumes)."""
    path = root / marker
    if root.exists() and (not path.exists() or path.read_text() != key):
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, key.encode())  # whole or absent, even on a full disk
    return root


def finished(model_dir: Path, key: str) -> bool:
    """Whether ``model_dir`` holds a model trained to the end under ``key``."""
    done = model_dir / DONE_FILE
    return done.exists() and done.read_text() == key


def mark_finished(model_dir: Path, key: str) -> None:
    atomic_write_bytes(model_dir / DONE_FILE, key.encode())  # a half-written DONE never counts
