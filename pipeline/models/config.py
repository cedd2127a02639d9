"""The params of training a policy: SFT, DPO (the TRL losses train-dpo accepts) and LoRA adapters."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipeline.core.config import Section

#: The loss types of TRL 1.16's DPOTrainer that train-dpo accepts (``sft`` is RPO's term: ``rpo_alpha``).
#: All of them read the reference log-probs from the batch, so they work with the stored ones of reflogprobs;
#: the length-normalised ones (sigmoid_norm, ipo) divide by the assistant-only token count of that same mask.
DPO_LOSS_TYPES = (
    "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot", "aot_unpaired",
    "apo_zero", "apo_down", "discopop", "sigmoid_norm",
)
#: Preference losses that are not DPOTrainer losses in TRL 1.16, and why train-dpo cannot run them.
_UNSUPPORTED_LOSSES = {
    "sft": "is RPO's NLL term: set train_policy.dpo.rpo_alpha instead",
    "simpo": "is reference-free (TRL's CPOTrainer, not DPOTrainer); for a length-normalised DPO against the "
             "stored reference log-probs use sigmoid_norm",
    "cpo": "is reference-free (TRL's CPOTrainer, not DPOTrainer)",
    "orpo": "is reference-free (TRL's ORPOTrainer, not DPOTrainer)",
}


def check_dpo_loss_type(loss_type: str, label_smoothing: float | None = None) -> None:
    """ValueError (one line) unless ``loss_type`` is a DPOTrainer loss that works with stored reference log-probs."""
    if loss_type in _UNSUPPORTED_LOSSES:
        raise ValueError(f"loss_type {loss_type!r} {_UNSUPPORTED_LOSSES[loss_type]}; "
                         f"valid: {', '.join(DPO_LOSS_TYPES)}")
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; valid: {', '.join(DPO_LOSS_TYPES)}")
    if loss_type == "exo_pair" and label_smoothing is not None and label_smoothing == 0:
        raise ValueError("loss_type 'exo_pair' needs label_smoothing > 0 (the EXO paper uses 1e-3)")


class SFTConfigSection(Section):
    lr: float = Field(2e-3, gt=0, description="learning rate (LoRA adapters take a larger step than full fine-tuning)")
    epochs: float = Field(3.0, gt=0, description="passes over the SFT data")
    batch_size: int = Field(16, ge=1, description="conversations per step")
    warmup_ratio: float = Field(0.04, ge=0, lt=1, description="share of steps with a linear learning-rate warmup")


class DPOConfigSection(Section):
    lr: float = Field(5e-4, gt=0, description="learning rate")
    epochs: float = Field(2.0, gt=0, description="passes over the pairs")
    batch_size: int = Field(8, ge=1, description="pairs per step")
    beta: float = Field(0.1, gt=0, description="DPO's beta: strength of the pull towards the reference")
    rpo_alpha: float = Field(1.0, ge=0, description="weight of the NLL term on chosen (RPO); 0 = plain DPO")
    loss_type: str = Field(
        "sigmoid", description="TRL DPOTrainer loss type, one of DPO_LOSS_TYPES (sigmoid = DPO; sigmoid_norm and "
        "ipo divide each log-ratio by its assistant token count)")
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="robust: probability a label is flipped; exo_pair: its epsilon (> 0, "
        "paper 1e-3); aot/aot_unpaired: smoothing; ignored by the other loss types")
    init: Literal["sft", "base"] = Field(
        "sft", description="policy DPO starts from; reflogprobs scores the pairs with it (the reference = the "
        "policy DPO starts from, as in PAPRIKA)")
    warmup_ratio: float = Field(0.04, ge=0, lt=1, description="share of steps with a linear learning-rate warmup")

    @field_validator("loss_type")
    @classmethod
    def _loss_type_known(cls, value: str) -> str:
        check_dpo_loss_type(value)
        return value

    @model_validator(mode="after")
    def _exo_needs_smoothing(self) -> DPOConfigSection:
        check_dpo_loss_type(self.loss_type, self.label_smoothing)
        return self


class LoraConfigSection(Section):
    """LoRA adapters (peft) for train-sft / train-dpo: only adapters train, merged into the saved model."""

    enabled: bool = Field(True, description="train LoRA adapters instead of every weight "
                          "(the tiny policy generalises to held-out secrets better with them: docs/recipes.md)")
    r: int = Field(8, ge=1, le=1024, description="adapter rank")
    alpha: int = Field(16, ge=1, description="lora_alpha: adapters are scaled by alpha / r")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter input")
    target_modules: list[str] | None = Field(
        None, min_length=1, description="module names that get adapters; null = peft's default for the "
        "architecture (GPT-2: c_attn; Llama: q_proj, v_proj); ['all-linear'] = every linear layer but the head")
