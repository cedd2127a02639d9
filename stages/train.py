"""train-policy: SFT on the best trajectories, then DPO with RPO's α, both TRL trainers.

SFT: assistant-only loss on ``data/pairs_text/sft``, from the base policy → ``data/train_policy/sft``.
DPO: from the SFT policy (``train_policy.dpo.init``), pairs + stored reference log-probs from
``data/reflogprobs`` (reference = base policy; no reference model in memory) → ``data/train_policy/dpo``.
Each phase checkpoints every ``save_steps`` steps and a rerun resumes from the last checkpoint. With
``train_policy.lora.enabled`` both phases train LoRA adapters only and save the merged (plain) model.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.artifacts import atomic_write_json, dataset_hash, dir_hash, read_rows
from pipeline.config import Params
from pipeline.llm.hf import load_policy
from pipeline.models import tiny
from pipeline.models.training import dpo_train, sft_train
from pipeline.policies import policy_path
from pipeline.stage import StageContext, StageResult

NAME = "train-policy"
PARAMS = ["seed", "policy", "train_policy"]


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
    tiny.save(model, tokenizer, model_dir)  # swaps the new model in whole
    (model_dir / "DONE").write_text(key)
    shutil.rmtree(ckpt, ignore_errors=True)  # keep the DVC output small once the phase is done


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.train_policy
    out = params.data_path("train_policy")
    base = policy_path(params, "base")
    sft_dir, dpo_dir = out / "sft", out / "dpo"
    metrics: dict[str, float] = {}

    sft_src = params.data_path("pairs_text", "sft")
    sft_key = (params.section_hash(["seed", "policy", "train_policy.sft", "train_policy.lora"])
               + dataset_hash(sft_src) + dir_hash(base))
    if not finished(sft_dir, sft_key):
        model, tokenizer = load_policy(base, params.policy.device)
        conversations = [r["messages"] for r in read_rows(sft_src, ["messages"])]
        ckpt = checkpoint_dir(out / "checkpoints" / "sft", sft_key)
        model, history, resumed = sft_train(
            model, tokenizer, conversations, ckpt, lr=cfg.sft.lr, epochs=cfg.sft.epochs,
            batch_size=cfg.sft.batch_size, warmup_ratio=cfg.sft.warmup_ratio, seed=params.seed,
            save_steps=cfg.save_steps, tracker=ctx.tracker, prefix="sft", lora=cfg.lora,
        )
        atomic_write_json(params.plots_path("sft_loss.json"), history)
        finish(model, tokenizer, sft_dir, ckpt, sft_key)
        metrics["sft/trajectories"] = len(conversations)
        metrics["sft/resumed_from_step"] = resumed
        metrics["sft/final_loss"] = history[-1]["loss"] if history else float("nan")

    pairs_src = params.data_path("reflogprobs")
    init = sft_dir if cfg.dpo.init == "sft" else Path(base)
    dpo_key = (params.section_hash(["seed", "policy", "train_policy.dpo", "train_policy.lora"])
               + dataset_hash(pairs_src) + dir_hash(init))
    if not finished(dpo_dir, dpo_key):
        model, tokenizer = load_policy(init, params.policy.device)
        pairs = read_rows(pairs_src)
        ckpt = checkpoint_dir(out / "checkpoints" / "dpo", dpo_key)
        model, history, resumed = dpo_train(
            model, tokenizer, pairs, ckpt, lr=cfg.dpo.lr, epochs=cfg.dpo.epochs, batch_size=cfg.dpo.batch_size,
            beta=cfg.dpo.beta, rpo_alpha=cfg.dpo.rpo_alpha, loss_type=cfg.dpo.loss_type,
            label_smoothing=cfg.dpo.label_smoothing, warmup_ratio=cfg.dpo.warmup_ratio, seed=params.seed,
            save_steps=cfg.save_steps, tracker=ctx.tracker, lora=cfg.lora,
        )
        atomic_write_json(params.plots_path("dpo_loss.json"), history)
        finish(model, tokenizer, dpo_dir, ckpt, dpo_key)
        metrics["dpo/pairs"] = len(pairs)
        metrics["dpo/resumed_from_step"] = resumed
        metrics["dpo/final_loss"] = history[-1]["loss"] if history else float("nan")
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    return StageResult(metrics=metrics, outputs=[str(sft_dir), str(dpo_dir)])
