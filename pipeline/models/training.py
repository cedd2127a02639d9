"""Thin wrappers over TRL's SFT and DPO trainers, shared by bootstrap, train-sft, train-dpo and rl-text.

Both resume from the last checkpoint in their output directory, report losses to the stage tracker and
return the loss history (for dvc plots). Asked to stop (SIGTERM, :mod:`pipeline.core.interrupt`), a trainer saves a
checkpoint at the step it is on and raises ``Stopped``: the rerun resumes at that step. DPO reads reference
log-probs stored by the ``reflogprobs`` stage and masks non-assistant tokens, so no reference model is loaded and
environment turns never count. With ``lora`` enabled both train peft LoRA adapters only and return the model
with the adapters merged in (``merge_and_unload``), so what is saved is a plain model every stage loads as before.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from transformers.trainer_callback import ExportableState

from pipeline.core import interrupt
from pipeline.core.config import ConfigError
from pipeline.core.processes import requested, world_size
from pipeline.core.tracking import Tracker
from pipeline.models.attention import install as install_attention
from pipeline.models.chat import assistant_token_mask, prompt_boundary
from pipeline.models.config import LoraConfigSection, check_dpo_loss_type
from pipeline.models.launch import launched, stopped_quietly

install_attention()  # grouped-query heads read in place in CPU inference: the same numbers, no copies


class _TrackerCallback(TrainerCallback):
    def __init__(self, tracker: Tracker, prefix: str) -> None:
        self.tracker, self.prefix = tracker, prefix

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: D401 - HF hook
        if logs:
            scalars = {f"{self.prefix}/{k}": v for k, v in logs.items() if isinstance(v, int | float)}
            self.tracker.log_metrics(scalars, step=state.global_step)


class _CheckpointOnSignal(TrainerCallback):
    """A stop asked for (SIGTERM): save a checkpoint at this step and end training (the Trainer's own save and stop
    flags, so the checkpoint is the one a periodic save writes). Several processes stop at the same step: the
    request is reduced over them (one of them asked: all stop)."""

    def __init__(self, point: interrupt.Point) -> None:
        self.point = point  # where a rerun resumes: the last checkpoint saved

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: D401 - HF hook
        self.point.text = f"step {state.global_step} of {state.max_steps}"

    def on_save(self, args, state, control, **kwargs):  # noqa: D401 - HF hook
        self.point.text = f"step {state.global_step} of {state.max_steps}"

    def on_step_end(self, args, state, control, **kwargs):  # noqa: D401 - HF hook
        if _stop_agreed():
            control.should_save = True
            control.should_training_stop = True
        return control


_TOKENS = "_total_train_tokens"  # SFTTrainer's counter


class _TokenCount(TrainerCallback, ExportableState):
    """TRL's SFTTrainer counts the tokens it has trained on (its logged ``num_tokens``) but keeps no count in its
    checkpoints, so a resumed run would count again from 0 and log other figures than an uninterrupted run. The count
    goes into each checkpoint's trainer_state.json, where the Trainer keeps its callbacks' state
    (``stateful_callbacks``), and :func:`_train` gives it back on resume."""

    def __init__(self, trainer=None) -> None:
        self.trainer = trainer

    def state(self) -> dict:
        return {"args": {}, "attributes": {"tokens": getattr(self.trainer, _TOKENS, 0)}}


def _restore_token_count(trainer, checkpoint: str) -> None:
    saved = json.loads((Path(checkpoint) / "trainer_state.json").read_bytes()).get("stateful_callbacks", {})
    if (tokens := saved.get(_TokenCount.__name__, {}).get("attributes", {}).get("tokens")) is not None:
        setattr(trainer, _TOKENS, tokens)


def _stop_agreed() -> bool:
    asked = interrupt.requested() is not None
    if world_size() == 1 or not torch.distributed.is_initialized():
        return asked
    device = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([1.0 if asked else 0.0], device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())


def _last_checkpoint(path: Path) -> str | None:
    """The newest *complete* ``checkpoint-N`` under ``path``. The Trainer writes a checkpoint in place and its
    ``trainer_state.json`` last, so a checkpoint without a readable one was cut short (a kill, a full disk): it is
    removed, never resumed from, and the one before it is used."""
    if not path.is_dir():
        return None
    found = sorted((int(m.group(1)), p) for p in path.iterdir()
                   if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name)))
    for _, ckpt in reversed(found):
        try:
            json.loads((ckpt / "trainer_state.json").read_bytes())
            return str(ckpt)
        except (OSError, ValueError):
            shutil.rmtree(ckpt, ignore_errors=True)
    return None


def _common_args(out: Path, lr: float, epochs: float, batch_size: int, warmup_ratio: float, seed: int,
                 save_steps: int) -> dict[str, Any]:
    processes = world_size()
    if batch_size % processes:
        raise ConfigError(f"train_policy.num_processes: {processes} processes cannot split a batch of {batch_size}")
    return dict(
        output_dir=str(out),
        learning_rate=lr,
        num_train_epochs=epochs,
        per_device_train_batch_size=batch_size // processes,  # batch_size is the global batch
        lr_scheduler_type="cosine",
        warmup_steps=warmup_ratio,  # transformers 5: a float in [0, 1) is the share of steps
        logging_steps=5,
        save_strategy="steps",
        save_steps=save_steps,
        save_total_limit=1,
        report_to=[],
        seed=seed,
        data_seed=seed,
        use_cpu=not torch.cuda.is_available(),
        # TRL turns bf16 on by default; on CPU that is autocast to bf16 (slow without AMX, and its log-probs
        # drift from the float32 ones reflogprobs stores). bf16 only where a GPU supports it.
        bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        fp16=False,
        # TRL turns gradient checkpointing on by default: it saves activation memory by running each forward a
        # second time in backward. Curio's models fit in memory without it; recomputing costs ~1/3 of a step and
        # changes no gradient (bench/bench_train.py: bitwise-identical weights).
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        disable_tqdm=bool(os.environ.get("TQDM_DISABLE")),
    )


def peft_config(lora: LoraConfigSection | None, model):
    """The peft ``LoraConfig`` for ``lora`` (None when LoRA is off): adapters on ``target_modules`` (peft's
    default for the architecture when null), scaled by alpha / r."""
    if lora is None or not lora.enabled:
        return None
    from peft import LoraConfig

    targets = lora.target_modules
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules="all-linear" if targets == ["all-linear"] else targets,
        fan_in_fan_out=model.config.model_type == "gpt2",  # GPT-2 stores its linear layers transposed (Conv1D)
        task_type="CAUSAL_LM",
    )


def trained_model(trainer, merge: bool = True):
    """The trainer's model; with LoRA adapters merged into the base weights (a plain model) unless ``merge`` is
    False (then the peft model, adapters separate)."""
    model = trainer.model
    if merge and hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    return model


def loss_history(trainer) -> list[dict]:
    return [{"step": h["step"], "loss": h["loss"]} for h in trainer.state.log_history if "loss" in h]


def _train(trainer, checkpoint_dir: Path) -> int:
    """Train, resuming from the last checkpoint; returns the step resumed from (0 = fresh start). Asked to stop:
    ``Stopped`` once the checkpoint of the current step is saved."""
    last = _last_checkpoint(checkpoint_dir)
    resumed = int(Path(last).name.split("-")[-1]) if last else 0
    # TRL writes a model card into the checkpoint directory on each save, its tags in a set's order (which varies
    # with the hash seed from run to run): no card, so a rerun's outputs are the same bytes
    trainer.create_model_card = lambda *args, **kwargs: None
    with interrupt.at(f"step {resumed}") as point:
        trainer.add_callback(_CheckpointOnSignal(point))
        if hasattr(trainer, _TOKENS):
            trainer.add_callback(_TokenCount(trainer))
            if last:
                _restore_token_count(trainer, last)
        trainer.train(resume_from_checkpoint=last)
        if trainer.state.global_step < trainer.state.max_steps:  # stopped early: the checkpoint is saved
            interrupt.check()
    return resumed


def padding_free_supported(model, on_gpu: bool) -> bool:
    """Whether padding-free batches are safe for ``model``: always on CPU (float32); on a GPU, where training runs
    in bf16, only with a flash-attention kernel (what TRL documents padding-free for). With the sdpa kernel, bf16
    and packed sequences the built-in model's bootstrap diverged to NaN mid-run on an H100; padded batches, or
    float32, trained normally."""
    return not on_gpu or str(getattr(model.config, "_attn_implementation", "")).startswith("flash")


def sft_train(
    model,
    tokenizer,
    conversations: list[list[dict]],
    checkpoint_dir: Path,
    *,
    lr: float,
    epochs: float,
    batch_size: int,
    warmup_ratio: float = 0.04,
    seed: int = 0,
    save_steps: int = 50,
    tracker: Tracker | None = None,
    prefix: str = "sft",
    lora: LoraConfigSection | None = None,
    merge: bool = True,
    padding_free: bool = False,
):
    """Assistant-only SFT on whole conversations (TRL SFTTrainer); resumes from ``checkpoint_dir``. The loss
    covers the tokens ``pipeline.models.chat.assistant_token_mask`` marks (assistant content + end-of-turn).

    ``padding_free`` flattens each batch into one sequence (TRL's padding-free collator, which passes the
    conversations' boundaries; on a CPU ``pipeline.models.attention`` attends within each conversation, elsewhere
    transformers masks between them), so no compute goes to padding; every conversation must then fit the model's
    context (nothing is truncated). Ignored where unsafe (``padding_free_supported``).

    With ``lora`` enabled only LoRA adapters train; they are merged into the returned model unless ``merge`` is
    False.
    """
    processes, config_file = requested()
    if processes > 1 or config_file:
        return launched("sft_train", model, tokenizer, conversations, checkpoint_dir, dict(
            lr=lr, epochs=epochs, batch_size=batch_size, warmup_ratio=warmup_ratio, seed=seed, save_steps=save_steps,
            lora=lora, merge=merge, padding_free=padding_free), num_processes=processes, config_file=config_file,
            tracker=tracker, prefix=prefix)
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    # Pre-tokenized with the assistant masks of tokenize_pair (any chat template): TRL turns them into labels.
    rows = []
    for c in conversations:
        ids, mask, _ = assistant_token_mask(tokenizer, c)
        if not any(mask):
            raise ValueError("an SFT conversation has no assistant tokens to learn")
        rows.append({"input_ids": ids, "assistant_masks": mask})
    dataset = Dataset.from_list(rows)
    padding_free = padding_free and padding_free_supported(model, torch.cuda.is_available())
    max_len = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", 1024)
    args = SFTConfig(
        **_common_args(checkpoint_dir, lr, epochs, batch_size, warmup_ratio, seed, save_steps),
        max_length=None if padding_free else max_len,
        padding_free=padding_free,
        dataset_num_proc=None,
    )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[_TrackerCallback(tracker, prefix)] if tracker else None,
        peft_config=peft_config(lora, model),
    )
    resumed = _train(trainer, checkpoint_dir)
    return trained_model(trainer, merge), loss_history(trainer), resumed


# -- DPO with stored reference log-probs and assistant-only masks ----------------------------------------------
def tokenize_pair(tokenizer, prompt: list[dict], chosen: list[dict], rejected: list[dict]) -> dict:
    """Token ids of prompt / chosen / rejected and the masks of the tokens whose log-probs count.

    The mask covers each assistant turn's content and the end-of-turn token that stops it, for any chat template
    (``pipeline.models.chat``): environment (user) turns, role headers and separators are excluded (PAPRIKA built
    such a mask but summed over the template tokens too; see RECIPES.md, Known bugs). SFT uses the same mask.
    Assistant turns inside ``prompt`` (a multi-turn state's earlier moves) are context: only the completion's
    turns count.
    """
    out: dict[str, Any] = {}
    for name, completion in (("chosen", chosen), ("rejected", rejected)):
        ids, mask, offsets = assistant_token_mask(tokenizer, prompt + completion, count_from=len(prompt))
        n = prompt_boundary(tokenizer, prompt, prompt + completion, ids, mask, offsets)
        if "prompt_ids" in out and out["prompt_ids"] != ids[:n]:
            raise ValueError("chosen and rejected render the prompt differently")
        out["prompt_ids"] = ids[:n]
        out[f"{name}_ids"], out[f"{name}_mask"] = ids[n:], mask[n:]
    return out


@torch.no_grad()
def sequence_logps(model, sequences: list[tuple[list[int], list[int], list[int]]], batch_size: int = 16,
                   device: str = "cpu") -> list[float]:
    """Sum of log π(token) over masked completion tokens, for (prompt_ids, completion_ids, mask) triples."""
    model.eval()
    out: list[float] = []
    pad = model.config.pad_token_id or 0
    for start in range(0, len(sequences), batch_size):
        batch = sequences[start : start + batch_size]
        full = [p + c for p, c, _ in batch]
        masks = [[0] * len(p) + m for p, _, m in batch]
        width = max(len(x) for x in full)
        ids = torch.tensor([x + [pad] * (width - len(x)) for x in full], device=device)
        attn = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in full], device=device)
        mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], device=device, dtype=torch.float32)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        out.extend((logp * mask[:, 1:]).sum(dim=1).tolist())
    return out


def implicit_margins(policy_chosen: list[float], policy_rejected: list[float], ref_chosen: list[float],
                     ref_rejected: list[float], beta: float) -> list[float]:
    """DPO's implicit reward margin of each pair, β·[(log π − log π_ref)(chosen) − (log π − log π_ref)(rejected)],
    from summed log-probs (:func:`sequence_logps`; what TRL logs as ``rewards/margins``)."""
    return [beta * ((c - rc) - (j - rj))
            for c, j, rc, rj in zip(policy_chosen, policy_rejected, ref_chosen, ref_rejected, strict=True)]


@dataclass
class _MaskedPreferenceCollator:
    """TRL's preference collator, but the completion mask is the stored assistant-only mask."""

    pad_token_id: int

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        seqs, masks = [], []
        for side in ("chosen", "rejected"):
            for ex in examples:
                seqs.append(ex["prompt_ids"] + ex[f"{side}_ids"])
                masks.append([0] * len(ex["prompt_ids"]) + ex[f"{side}_mask"])
        width = max(len(s) for s in seqs)
        batch = {
            "input_ids": torch.tensor([s + [self.pad_token_id] * (width - len(s)) for s in seqs]),
            "attention_mask": torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs]),
            "completion_mask": torch.tensor([m + [0] * (width - len(m)) for m in masks]),
        }
        if "ref_chosen_logps" in examples[0]:
            batch["ref_chosen_logps"] = torch.tensor([ex["ref_chosen_logps"] for ex in examples])
            batch["ref_rejected_logps"] = torch.tensor([ex["ref_rejected_logps"] for ex in examples])
        return batch


def _stored_ref_trainer_class():
    from trl import DPOTrainer

    class StoredRefDPOTrainer(DPOTrainer):
        """DPOTrainer on pre-tokenized, pre-masked pairs whose reference log-probs were computed once."""

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset  # already tokenized and masked by tokenize_pair

        def _precompute_ref_logps(self, dataset, name, batch_size):
            if "ref_chosen_logps" not in dataset.column_names:
                raise ValueError("pairs lack ref_chosen_logps / ref_rejected_logps: run the reflogprobs stage")
            return dataset

    return StoredRefDPOTrainer


def dpo_train(
    model,
    tokenizer,
    pairs: list[dict],
    checkpoint_dir: Path,
    *,
    lr: float,
    epochs: float,
    batch_size: int,
    beta: float,
    rpo_alpha: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    warmup_ratio: float = 0.04,
    seed: int = 0,
    save_steps: int = 50,
    tracker: Tracker | None = None,
    lora: LoraConfigSection | None = None,
    merge: bool = True,
):
    """DPO (+ RPO's α·NLL on chosen) from pairs carrying prompt/chosen/rejected ids, masks and ref log-probs.

    ``loss_type`` is any TRL DPOTrainer loss of ``pipeline.core.config.DPO_LOSS_TYPES`` (ConfigError otherwise): every
    one reads the stored reference log-probs, and the length-normalised ones (sigmoid_norm, ipo) divide both the
    policy's and the reference's sums by the same assistant-only token count. With ``lora`` enabled only LoRA
    adapters train; they are merged into the returned model unless ``merge`` is False.
    """
    processes, config_file = requested()
    if processes > 1 or config_file:
        return launched("dpo_train", model, tokenizer, pairs, checkpoint_dir, dict(
            lr=lr, epochs=epochs, batch_size=batch_size, beta=beta, rpo_alpha=rpo_alpha, loss_type=loss_type,
            label_smoothing=label_smoothing, warmup_ratio=warmup_ratio, seed=seed, save_steps=save_steps, lora=lora,
            merge=merge), num_processes=processes, config_file=config_file, tracker=tracker, prefix="dpo")
    from datasets import Dataset
    from trl import DPOConfig

    try:
        check_dpo_loss_type(loss_type, label_smoothing)
    except ValueError as e:
        raise ConfigError(f"train_policy.dpo: {e}") from None

    keep = ("prompt_ids", "chosen_ids", "chosen_mask", "rejected_ids", "rejected_mask", "ref_chosen_logps",
            "ref_rejected_logps")
    dataset = Dataset.from_list([{k: p[k] for k in keep} for p in pairs])
    # RPO = DPO + α · mean NLL over chosen assistant tokens; TRL expresses it as the "sft" loss term.
    losses, weights = [loss_type], [1.0]
    if rpo_alpha > 0:
        losses.append("sft")
        weights.append(rpo_alpha)
    args = DPOConfig(
        **_common_args(checkpoint_dir, lr, epochs, batch_size, warmup_ratio, seed, 10_000_000),
        beta=beta,
        loss_type=losses,
        loss_weights=weights,
        label_smoothing=label_smoothing,
        precompute_ref_log_probs=True,
        remove_unused_columns=False,
        max_length=None,
    )
    args.save_steps = save_steps
    trainer = _stored_ref_trainer_class()(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        data_collator=_MaskedPreferenceCollator(tokenizer.pad_token_id),
        callbacks=[_TrackerCallback(tracker, "dpo")] if tracker else None,
        peft_config=peft_config(lora, model),
    )
    resumed = _train(trainer, checkpoint_dir)
    return trained_model(trainer, merge), loss_history(trainer), resumed


def _restore_cpu_index() -> None:
    """Resuming a checkpoint in several CPU processes, the Trainer loads the optimizer state onto ``args.device``,
    which is then ``cpu:0``, a location torch's loader does not know: this maps any ``cpu:N`` to the CPU."""
    torch.serialization.register_package(
        11, lambda obj: None, lambda obj, location: obj if location.startswith("cpu:") else None)


def main(job: Path) -> None:
    """One process of a trainer's ``accelerate launch`` (:func:`pipeline.models.launch.launched`): train with the
    job's data; rank 0 saves the model and the loss history."""
    from accelerate import PartialState

    spec = torch.load(job / "job.pt", weights_only=False)
    if not torch.cuda.is_available():
        _restore_cpu_index()
    model = AutoModelForCausalLM.from_pretrained(job / "init")
    tokenizer = AutoTokenizer.from_pretrained(job / "init")
    fn = {"sft_train": sft_train, "dpo_train": dpo_train}[spec["trainer"]]
    with stopped_quietly(spec["trainer"]):  # SIGTERM: the checkpoint of the step all processes agree on
        trained, history, resumed = fn(model, tokenizer, spec["data"], Path(spec["checkpoint_dir"]),
                                       **spec["kwargs"])
    if PartialState().is_main_process:
        trained.save_pretrained(job / "out")
        (job / "result.json").write_text(json.dumps({"history": history, "resumed": resumed}))
    PartialState().wait_for_everyone()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
