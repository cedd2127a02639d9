"""Sampling inside transformers' ``generate`` at a cost that does not grow with the vocabulary.

``generate(do_sample=True)`` draws each token with ``torch.multinomial(softmax(scores), 1)``, which draws an
exponential variate for *every* vocabulary entry of every row, also for the entries top-k / top-p have already
set to zero: at a batch of 64 over the built-in model's 1,979 tokens that was 11 % of batched play's CPU time.
``GumbelSampler`` is a logits processor that draws the same distribution with noise for the kept entries only:
for scores s, argmax_i (s_i - log E_i) with E_i ~ Exp(1) is distributed as softmax(s) (the Gumbel-max trick:
-log E is a standard Gumbel variate), and entries at -inf can never win. It returns the noisy scores, whose
largest entry is the sampled token, so ``generate``'s greedy step (``do_sample=False``) takes it.

``sampling_warpers`` builds the processors ``generate`` itself would add for sampling (temperature, top-k, top-p,
min-p: transformers' own classes, in transformers' order, with the model's ``generation_config`` defaults such as
``top_k=50``), so the distribution sampled is exactly the one ``do_sample=True`` samples; the random draws differ.
"""

from __future__ import annotations

import copy

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
    config = copy.deepcopy(config)  # what generate() does: fields left unset take transformers' global defaults
    config.update(**config._get_default_generation_params(), defaults_only=True)
    if ((config.typical_p is not None and config.typical_p < 1.0)
            or (config.epsilon_cutoff is not None and 0.0 < config.epsilon_cutoff < 1.0)
            or (config.eta_cutoff is not None and 0.0 < config.eta_cutoff < 1.0)
            or config.watermarking_config is not None or config.renormalize_logits
            or (config.num_beams or 1) > 1):
        return None
    warpers: list[LogitsProcessor] = []
    if sampling.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(sampling.temperature))
    own = sampling.top_k is not None  # the request says all of its truncation: the config adds none
    top_k = sampling.top_k if own else config.top_k
    if top_k:
        warpers.append(TopKLogitsWarper(top_k=top_k))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=sampling.top_p))
    min_p = sampling.min_p if sampling.min_p > 0 or own else config.min_p
    if min_p:
        warpers.append(MinPLogitsWarper(min_p=min_p))
    return warpers


class GumbelSampler(LogitsProcessor):
    """Last logits processor of a sampled ``generate(do_sample=False)``: draws each row's token from
    softmax(scores) (Gumbel-max over the finite scores); the greedy step's argmax of what it returns is that token.
    With ``logprobs``, keeps each step's log-softmax(scores) of the drawn tokens (``logprobs``: rows × steps), the
    numbers ``compute_transition_scores(..., normalize_logits=True)`` gives for ``do_sample=True``.

    ``top_k``: this processor does the top-k filter itself (after ``temperature``), drawing among each row's k
    largest scores straight from ``topk``'s output, without the -inf pass over the vocabulary; a row with ties at
    the k-th score (which ``TopKLogitsWarper`` keeps all of) takes the general path."""

    def __init__(self, logprobs: bool = False, top_k: int = 0, temperature: float = 1.0) -> None:
        self.steps: list[torch.Tensor] | None = [] if logprobs else None
        self.top_k = top_k
        self.temperature = temperature

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.temperature != 1.0:
            scores = scores / self.temperature  # as TemperatureLogitsWarper
        if self.top_k:
            values, indices = scores.topk(min(self.top_k, scores.shape[-1]), dim=-1)
            if not (scores >= values[:, -1:]).sum(-1).gt(values.shape[-1]).any():  # no ties at the k-th
                pick = (values - torch.empty_like(values).exponential_().log()).argmax(dim=-1, keepdim=True)
                if self.steps is not None:
                    self.steps.append(values.log_softmax(dim=-1).gather(-1, pick).squeeze(-1))
                token = indices.gather(-1, pick)
                return torch.full_like(scores, float("-inf")).scatter_(-1, token, 0.0)
            scores = TopKLogitsWarper(self.top_k)(input_ids, scores)
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


def sampler_for(config: GenerationConfig, sampling: Sampling) -> list[LogitsProcessor] | None:
    """The logits processors that sample as ``generate(do_sample=True, ...)`` would under the model's ``config``
    (``sampling_warpers``, then a ``GumbelSampler``, which takes over temperature and top-k when they are all there
    is); None where only transformers' sampler will do."""
    warpers = sampling_warpers(config, sampling)
    if warpers is None:
        return None
    kinds = [type(w) for w in warpers]
    if kinds in ([TopKLogitsWarper], [TemperatureLogitsWarper, TopKLogitsWarper]):
        return [GumbelSampler(sampling.logprobs, top_k=warpers[-1].top_k, temperature=sampling.temperature)]
    return [*warpers, GumbelSampler(sampling.logprobs)]
