"""What train-sft and train-dpo share: finishing a phase and its metrics (checkpoints: ``pipeline.core.checkpoints``).

The policy is trained in two stages so the reference of DPO can be the policy DPO starts from (PAPRIKA):
train-sft (SFT on the best trajectories) → reflogprobs (scores the pairs with ``train_policy.dpo.init``, the SFT
policy by default) → train-dpo. Each phase checkpoints every ``save_steps`` steps into ``checkpoints/`` inside its
output directory and a rerun resumes from the last checkpoint; a finished phase holds a plain (merged) model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pipeline.core.artifacts import atomic_write_json
from pipeline.core.checkpoints import mark_finished
from pipeline.models import tiny

HISTORY = "loss_history.json"  # a finished phase's loss curve, kept beside its model
METRICS = "phase_metrics.json"  # and the metrics it reported, which a rerun that skips it reports again
RESUMED = "resumed_from_step"  # how this run went, not what it made: reported, never kept in the model's directory


def finish(model, tokenizer, model_dir: Path, ckpt: Path, key: str, history: list[dict],
           metrics: dict[str, float]) -> None:
    """Save the trained model (its loss curve and metrics beside it) into ``model_dir``, swapped in whole once
    complete (the previous model and the ``checkpoints/`` inside it go with the swap)."""
    tiny.save(model, tokenizer, model_dir)
    atomic_write_json(model_dir / HISTORY, history)
    # an interrupted and an uninterrupted run leave the same bytes (and so the same hash downstream)
    atomic_write_json(model_dir / METRICS, {k: v for k, v in metrics.items() if not k.endswith(f"/{RESUMED}")})
    mark_finished(model_dir, key)
    shutil.rmtree(model_dir / "checkpoints", ignore_errors=True)  # keep the DVC output small once done


def phase_metrics(prefix: str, items: str, count: int, resumed: int, history: list[dict]) -> dict[str, float]:
    """The metrics a finished SFT or DPO phase reports: what it trained on, where it resumed, its last loss."""
    return {f"{prefix}/{items}": count, f"{prefix}/{RESUMED}": resumed,
            f"{prefix}/final_loss": history[-1]["loss"] if history else float("nan")}


def phase_metric_help(prefix: str, items: str, what: str) -> dict[str, str]:
    """What each key of :func:`phase_metrics` means, as a stage declares it."""
    return {f"{prefix}/{items}": f"{what} trained on",
            f"{prefix}/{RESUMED}": "the optimizer step the phase resumed from (0: it started afresh); only the run "
                                   "that trained writes it",
            f"{prefix}/final_loss": "the training loss at the last logged step"}


def kept_metrics(model_dir: Path) -> dict[str, float]:
    """The metrics a finished phase reported when it trained: a rerun that skips it (resumed after the phase
    ended, or its outputs restored by DVC) reports the same, not an empty ``metrics/stages/*.json``; all but
    ``resumed_from_step``, which only the run that trained reports."""
    path = model_dir / METRICS
    return json.loads(path.read_text()) if path.exists() else {}


def write_loss_plot(plot: Path, model_dir: Path) -> None:
    """Write the declared loss plot from the finished phase's kept curve: a phase skipped because it is finished
    (resumed, or its outputs restored by DVC / copied in) still leaves every output DVC declares."""
    path = model_dir / HISTORY
    atomic_write_json(plot, json.loads(path.read_text()) if path.exists() else [])
