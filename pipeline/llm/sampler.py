"""Sampling inside transformers' ``generate`` at a cost that does not grow with the vocabulary.

``generate(do_sample=True)`` draws each token with ``torch.multinomial(softmax(scores), 1)``, which draws an
exponential variate for *every* vocabulary entry of every row, also for the entries top-k / top-p have already
set to zero: at a batch of 64 over the built-in model's 1,979 tokens that was 11 % of batched play's CPU time.
``GumbelSampler`` is a logits processor that draws the same distribution with noise for the kept entries only:
for scores s, argmax_i (s_i - log E_i) with E_i ~ Exp(1) is distributed as softmax(s) (the Gumbel-max trick:
-log E is a standard Gumbel variate), and entries at -inf can never win. It returns noisy scores whose largest entry is the sampled
token, so it wins the argmax, so ``generate``'s greedy step (``do_sample=False``) takes it.

``sampling_warpers`` builds the processors ``generate`` itself would add for sampling (temperature, top-k, top-p,
min-p: transformers' own classes, in transformers' order, with the model's ``generation_config`` defaults such as
``top_k=50``), so the distribution sampled is exactly the one ``do_sample=True`` samples; the random draws differ.
"""

from __future__ import annotations

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from pipeline.llm.base import Sampling


def sampling_warpers(config: GenerationConfig, sampling: Sampling) -> list[LogitsProcessor] | None:
    """The warpers ``generate(do_sample=True, temperature=, top_p=, min_p=)`` would apply under the model's
    ``config``; None when that config asks for something only transformers' own sampler does (typical-p,
    epsilon / eta cutoffs, watermarking, renormalized logits, beams)."""
    if ((config.typical_p is not None and config.typical_p < 1.0)
            or (config.epsilon_cutoff is not None and 0.0 < config.epsilon_cutoff < 1.0)
            or (config.eta_cutoff is not None and 0.0 < config.eta_cutoff < 1.0)
            or config.watermarking_config is not None or config.renormalize_logits
            or (config.num_beams or 1) > 1):
        return None
    warpers: list[LogitsProcessor] = []
    if sampling.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(sampling.temperature))
    if config.top_k:
        warpers.append(TopKLogitsWarper(top_k=config.top_k))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=sampling.top_p))
    min_p = sampling.min_p if sampling.min_p > 0 else config.min_p
    if min_p is not None:
        warpers.append(MinPLogitsWarper(min_p=min_p))
    return warpers


class GumbelSampler(LogitsProcessor):
    """Last logits processor of a sampled ``generate(do_sample=False)``: draws each row's token from
    softmax(scores) (Gumbel-max over the finite scores): the greedy step's argmax of what it returns is that token. With ``logprobs``, keeps
    each step's log-softmax(scores) of the drawn tokens in ``logprobs`` (rows × steps once stacked): the numbers
    ``compute_transition_scores(..., normalize_logits=True)`` gives for ``do_sample=True``."""

    def __init__(self, logprobs: bool = False) -> None:
        self.steps: list[torch.Tensor] | None = [] if logprobs else None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        kept = scores > float("-inf")
        values = scores[kept]
        drawn = torch.full_like(scores, float("-inf"))
        drawn[kept] = values - torch.empty_like(values).exponential_().log()
        token = drawn.argmax(dim=-1, keepdim=True)
        if self.steps is not None:
            self.steps.append(scores.log_softmax(dim=-1).gather(-1, token).squeeze(-1))
        return drawn

    @property
    def logprobs(self) -> torch.Tensor:
        return torch.stack(self.steps, dim=1)
