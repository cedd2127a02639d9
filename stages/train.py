"""What train-sft and train-dpo share: checkpoint directories keyed by (params, inputs) and finishing a phase.

The policy is trained in two stages so the reference of DPO can be the policy DPO starts from (PAPRIKA):
train-sft (SFT on the best trajectories) → reflogprobs (scores the pairs with ``train_policy.dpo.init``, the SFT
policy by default) → train-dpo. Each phase checkpoints every ``save_steps`` steps into ``checkpoints/`` inside its
output directory and a rerun resumes from the last checkpoint; a finished phase holds a plain (merged) model.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.models import tiny


def checkpoint_dir(root: Path, key: str) -> Path:
    """A checkpoint directory that belongs to one (params, inputs) key; stale checkpoints are removed."""
    marker = root / "KEY"
    if root.exists() and (not marker.exists() or marker.read_text() != key):
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    marker.write_text(key)
    return root


def finished(model_dir: Path, key: str) -> bool:
    return (model_dir / "DONE").exists() and (model_dir / "DONE").read_text() == key


def finish(model, tokenizer, model_dir: Path, ckpt: Path, key: str) -> None:
    """Save the trained model into ``model_dir``, swapped in whole once complete (the previous model and the
    ``checkpoints/`` inside it go with the swap)."""
    tiny.save(model, tokenizer, model_dir)
    (model_dir / "DONE").write_text(key)
    shutil.rmtree(model_dir / "checkpoints", ignore_errors=True)  # keep the DVC output small once done


def phase_metrics(prefix: str, items: str, count: int, resumed: int, history: list[dict]) -> dict[str, float]:
    """The metrics a finished SFT or DPO phase reports: what it trained on, where it resumed, its last loss."""
    return {f"{prefix}/{items}": count, f"{prefix}/resumed_from_step": resumed,
            f"{prefix}/final_loss": history[-1]["loss"] if history else float("nan")}
