"""GRPO for multi-turn play: group-relative credit over the K episodes of one task, no critic.

A **step** is one reply the policy sampled (a reply that did not parse as a move is a step too); a **group** is
the K episodes of one task in a round. Each step ``t`` of an episode has a reward ``r_t`` (the stage's: the game's
outcome per turn, a dense ``rl_text.reward``, the format penalty) and the state it acted in (its **anchor**: the
conversation before it). ``R = Σ_t r_t`` is the episode's return and ``G_t = r_t + γ·G_{t+1}`` a step's discounted
return. ``F`` is the normaliser of ``scale_rewards`` (TRL's names): ``group`` = the sample standard deviation of the
values compared, + 1e-4 (TRL's ``rewards.std()``); ``batch`` = that of every such value of the round, + 1e-4;
``none`` = 1 (Dr. GRPO, Liu et al. 2025: dividing by a group's std favours its too-easy and too-hard tasks).

- **trajectory** (GRPO / StarPO): every step of episode ``i`` gets ``A_E = (R_i − mean_group R) / F``.
- **gigpo** (GiGPO, Feng et al. 2025): ``A = A_E + ω·A_S``. Steps of the group's episodes that acted in the same
  anchor state form a step group; ``A_S = (G_t − mean_step-group G) / F_S``, 0 for a step alone in its state, with
  ``F_S`` = 1 (``step_scale: none``, verl-agent's step-level default: a state two steps share would otherwise give
  ±0.707 for any difference of their returns) or their sample std + 1e-4 (``step_scale: group``). The
  paper matches a step's raw observation; here the anchor is the **whole conversation before the step** (system and
  task messages, every earlier move and reply, retries excluded), because an environment's reply alone ("Yes.") is
  the same text in unrelated states. Every episode of a group shares its first state, so the first move is always
  compared within the group; later states are shared where the episodes' conversations are still identical.
- **turn**: a step of game turn ``k`` gets ``(G − mean G) / F`` over the group's steps of turn ``k`` (0 where only
  one step reached it): each step is compared with the same game turn of the other episodes, never with earlier or
  later ones (which would mostly measure how many turns were left). Turns are the game's, not the reply's index: a
  reply that did not parse and was re-sampled belongs to the turn it was re-sampled in, and shifts no later turn.

A group whose steps all get 0 carries no signal and is skipped (trajectory: all returns equal).

**Loss** per sampled token (``token_loss``), with ``ρ = exp(logp − old)`` against the policy that played:
``−min(ρ·A, clip(ρ, 1 − ε, 1 + ε)·A)·w + β·KL``, KL = TRL's k3 ``exp(ref − logp) − (ref − logp) − 1``, ``w`` the
rollout correction's weight (1 without one). ``loss_type`` (TRL's names) says how token losses are averaged over an
optimizer step: ``dapo`` over the step's tokens that can move (weight ``w`` > 0; TRL's ``dapo`` and ``bnpo`` are
this when a step is one batch); ``grpo`` each reply's own mean over such tokens, then the mean over replies (GRPO's
1/|o|); ``dr_grpo`` the sum over tokens divided by a constant, the budget ``batch_size × max_new_tokens`` (Dr. GRPO).

**Log-probs** (π_θ, π_old and the reference alike) are those of the temperature-scaled softmax with no truncation,
``log_softmax(logits / T)`` (``token_logps``), as TRL and verl score: every sampled token has a finite log-prob and a
gradient, whatever top-k, top-p or min-p the sampler applied, and k3 stays finite. A sampler that truncated drew from
another distribution; the rollout correction weighs that gap. They are computed only at the positions of sampled
tokens: the output layer runs on those hidden states alone (``reply_logps``).

**Rollout correction** (``rollout_weights``; Yao et al. 2025, TRL's ``vllm_importance_sampling`` formulas): the
ratio ``ρ_s = exp(old − sampler)`` of the trainer's log-prob at the weights that played to the sampler's own, per
token or per reply (the product of its tokens' ratios); ``tis`` weights each token by ``min(ρ_s, C)`` (TRL's
``token_truncate`` / ``sequence_truncate``), ``mask`` by ``ρ_s`` where ``1/C ≤ ρ_s ≤ C`` and 0 elsewhere (TRL's
``token_mask`` / ``sequence_mask`` with bounds [1/C, C]). A token either side reports at or below ``LOGP_FLOOR`` (or
not finite) carries no measurable ratio: it is left out of the gap statistics and of its reply's product, and
weighs 0.

**Packing** (``pack_episode``): the tokens trained on are the ids the policy was given and sampled, as played
(token in, token out). Where each reply's prompt extends the previous prompt plus reply (checked by ids), an
episode's replies sit in one sequence and are scored in one causal pass, each reply seeing exactly the context it
was played with; where it does not (a reply re-tokenised into a later prompt, a context that dropped old turns, a
re-sampled reply), the sequence is cut and the next reply starts one of its own. Sequences are scored
padding-free, several in one row (``pipeline.models.attention`` attends within each).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

STD_EPS = 1e-4  # TRL's: (r - mean) / (std + 1e-4)
LOGP_FLOOR = -1e4  # a log-prob at or below it (an engine's stand-in for -inf) is no measurement of a ratio

Credit = Literal["trajectory", "gigpo", "turn"]
Scale = Literal["group", "batch", "none"]
StepScale = Literal["none", "group"]
LossType = Literal["dapo", "grpo", "dr_grpo"]


# -- credit ---------------------------------------------------------------------------------------------------
@dataclass
class Steps:
    """One episode's steps for credit: each step's reward, the state it acted in and the game turn it belongs to
    (empty: the step's index)."""

    rewards: list[float]
    anchors: list[Hashable] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)


def sample_std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """``G_t = r_t + γ·G_{t+1}``, from the last step back."""
    out, running = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def relative(values: Sequence[float], scale: Scale, batch_std: float = 0.0) -> list[float]:
    """``(v − mean) / F`` over ``values`` compared together (F of ``scale``; ``batch_std`` for ``batch``); 0 for a
    value compared with no other."""
    if len(values) < 2:
        return [0.0] * len(values)
    mean = sum(values) / len(values)
    norm = {"group": sample_std(values) + STD_EPS, "batch": batch_std + STD_EPS, "none": 1.0}[scale]
    return [(v - mean) / norm for v in values]


def group_advantages(returns: Sequence[float], scale: Scale = "group", batch_std: float = 0.0) -> list[float] | None:
    """Trajectory credit of one group: ``(R − mean) / F``; None when every return is the same (no signal)."""
    if len(returns) < 2 or max(returns) == min(returns):
        return None
    return relative(returns, scale, batch_std)


def turn_advantages(group: Sequence[Steps], gamma: float, scale: Scale = "group",
                    batch_std: float = 0.0) -> list[list[float]]:
    """Turn credit of one group: each step's ``G_t`` against the group's steps of the same game turn."""
    returns = [discounted_returns(e.rewards, gamma) for e in group]
    at: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for i, e in enumerate(group):
        turns = e.turns or list(range(len(e.rewards)))
        if len(turns) != len(e.rewards):
            raise ValueError(f"grpo: {len(e.rewards)} step rewards but {len(turns)} step turns")
        for t, turn in enumerate(turns):
            at[turn].append((i, t))
    out = [[0.0] * len(g) for g in returns]
    for members in at.values():
        for (i, t), a in zip(members, relative([returns[i][t] for i, t in members], scale, batch_std), strict=True):
            out[i][t] = a
    return out


def gigpo_advantages(group: Sequence[Steps], gamma: float, omega: float, scale: Scale = "group",
                     batch_std: float = 0.0, step_scale: StepScale = "none") -> list[list[float]]:
    """GiGPO's ``A_E + ω·A_S`` for each step of one group (``scale`` and ``batch_std``: the episode advantage's
    normaliser; ``step_scale``: the step advantage's)."""
    totals = [sum(e.rewards) for e in group]
    episode = relative(totals, scale, batch_std)
    returns = [discounted_returns(e.rewards, gamma) for e in group]
    clusters: dict[Hashable, list[tuple[int, int]]] = defaultdict(list)
    for i, e in enumerate(group):
        for t, anchor in enumerate(e.anchors):
            clusters[anchor].append((i, t))
    step = [[0.0] * len(g) for g in returns]
    for members in clusters.values():
        for (i, t), a in zip(members, relative([returns[i][t] for i, t in members], step_scale), strict=True):
            step[i][t] = a
    return [[episode[i] + omega * a for a in step[i]] for i in range(len(group))]


def round_advantages(groups: Sequence[Sequence[Steps]], credit: Credit, gamma: float = 1.0, omega: float = 1.0,
                     scale: Scale = "group", step_scale: StepScale = "none") -> list[list[list[float]] | None]:
    """Per group of the round, each episode's per-step advantages (None: a group with no signal, skipped)."""
    batch = (0.0, 0.0)
    if scale == "batch":
        totals = [sum(e.rewards) for g in groups for e in g]
        step_returns = [x for g in groups for e in g for x in discounted_returns(e.rewards, gamma)]
        batch = (sample_std(totals), sample_std(step_returns))
    out: list[list[list[float]] | None] = []
    for group in groups:
        if credit == "trajectory":
            episode = group_advantages([sum(e.rewards) for e in group], scale, batch[0])
            adv = None if episode is None else [[a] * len(e.rewards) for a, e in zip(episode, group, strict=True)]
        elif credit == "gigpo":
            adv = gigpo_advantages(group, gamma, omega, scale, batch[0], step_scale)
        elif credit == "turn":
            adv = turn_advantages(group, gamma, scale, batch[1])
        else:
            raise ValueError(f"grpo: no credit named {credit!r}")
        out.append(adv if adv is not None and any(a != 0.0 for e in adv for a in e) else None)
    return out


# -- the loss -----------------------------------------------------------------------------------------------
def token_loss(logp: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
               clip_eps: float, beta: float = 0.0, ref: torch.Tensor | None = None, loss_type: LossType = "dapo",
               budget: int = 0, weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """The clipped GRPO loss over replies (each tensor ``[replies, tokens]``; ``advantages`` per reply or per
    token; ``weights`` the rollout correction's, per token), averaged as ``loss_type`` says (``budget``: ``dr_grpo``'s
    constant denominator, in tokens); with the share of tokens clipped, the mean KL and the share of tokens whose
    log-prob gets a gradient (``moving``: a nonzero coefficient in the loss, and a probability below 1)."""
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    ratio = torch.exp(logp - old)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    live = mask if weights is None else mask * (weights > 0)  # the tokens that can move
    if weights is not None:
        per_token = per_token * weights
    kl = torch.zeros_like(logp)
    if beta > 0:
        if ref is None:
            raise ValueError("grpo: beta > 0 needs the reference log-probs")
        log_ratio = ref - logp  # both untruncated: finite, and k3's gradient 1 - exp(ref - logp) is too
        kl = torch.exp(log_ratio) - log_ratio - 1
        per_token = per_token + beta * kl
    n = live.sum().clamp(min=1)
    if loss_type == "dapo":
        loss = (per_token * live).sum() / n
    elif loss_type == "grpo":
        loss = ((per_token * live).sum(-1) / live.sum(-1).clamp(min=1)).mean()
    elif loss_type == "dr_grpo":
        if budget < 1:
            raise ValueError("grpo: loss_type dr_grpo needs its constant budget (batch_size x max_new_tokens)")
        loss = (per_token * live).sum() / budget
    else:
        raise ValueError(f"grpo: no loss_type named {loss_type!r}")
    with torch.no_grad():
        total = mask.sum().clamp(min=1)
        pg = (live > 0) & (advantages != 0) & ~(clipped < unclipped)  # the clipped branch is flat in ρ
        pulled = (kl > 0) if beta > 0 else torch.zeros_like(pg)
        moving = (pg | pulled) & (logp < 0) & (mask > 0)
        stats = {"clipped": float(((clipped < unclipped).float() * mask).sum() / total),
                 "kl": float((kl * mask).sum() / total), "moving": float(moving.float().sum() / total)}
    return loss, stats


def rollout_weights(old: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, mode: str, level: str,
                    cap: float) -> tuple[torch.Tensor | None, dict]:
    """The rollout correction's weight per token (None for ``none``) from the trainer's log-probs at the weights
    that played (``old``) and the sampler's, ``[replies, tokens]``; with the gap's statistics over the tokens both
    sides measured (neither at or below ``LOGP_FLOOR``, both finite): mean and max |Δ log p| per token, the share of
    tokens whose weight the correction changed, and the share of floored tokens (weight 0, left out of the
    statistics and of a reply's product)."""
    measured = mask.bool() & torch.isfinite(old) & torch.isfinite(sampler) & (old > LOGP_FLOOR) & (
        sampler > LOGP_FLOOR)
    diff = torch.where(measured, old - sampler, torch.zeros_like(old))
    n, total = measured.sum().clamp(min=1), mask.sum().clamp(min=1)
    stats = {"gap_mean": float(diff.abs().sum() / n), "gap_max": float(diff.abs().max()) if diff.numel() else 0.0,
             "tokens": int(mask.sum()), "corrected": 0.0,
             "floored": float((mask.bool() & ~measured).float().sum() / total)}
    if mode == "none":
        return None, stats
    ratio = torch.exp(diff.sum(-1, keepdim=True) if level == "sequence" else diff).expand_as(diff)
    if mode == "tis":
        changed = ratio > cap
        weights = ratio.clamp(max=cap)
    elif mode == "mask":
        changed = (ratio > cap) | (ratio < 1 / cap)
        weights = ratio.masked_fill(changed, 0.0)
    else:
        raise ValueError(f"grpo: no rollout_correction named {mode!r}")
    stats["corrected"] = float((changed & measured).float().sum() / n)
    return weights * measured, stats


# -- log-probs of the sampled tokens, where they are used ---------------------------------------------------
def token_logps(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log-prob of each ``targets`` token under the temperature-scaled softmax of the rows of ``logits``
    ``[tokens, vocab]``, untruncated: what TRL and verl score π_θ, π_old and the reference with."""
    scores = logits.float()
    if temperature != 1.0:
        scores = scores / temperature
    return torch.log_softmax(scores, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


def decoder_and_head(model) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The transformer body and the output layer of a causal LM (a PEFT model's too: its adapters sit inside)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(inner, inner.base_model_prefix), inner.get_output_embeddings()


@dataclass
class Packed:
    """Token ids of one sequence and where its scored replies sit: (start, length) of each, in order."""

    ids: list[int]
    replies: list[tuple[int, int]]


def reply_logps(model, sequences: Sequence[Packed], temperature: float = 1.0) -> list[torch.Tensor]:
    """Per scored reply of ``sequences``, in order, the log-prob of each of its tokens given everything before it
    in its sequence (``token_logps``): one padding-free forward of the sequences side by side in one row, the
    output layer and the softmax only at the positions that predict a reply token."""
    body, head = decoder_and_head(model)
    device = next(model.parameters()).device
    ids = torch.tensor([t for s in sequences for t in s.ids], device=device)[None]
    positions = torch.cat([torch.arange(len(s.ids), device=device) for s in sequences])[None]
    lengths = torch.tensor([0] + [len(s.ids) for s in sequences], device=device)
    bounds = torch.cumsum(lengths, 0).to(torch.int32)
    longest = max(len(s.ids) for s in sequences)
    at, offset = [], 0
    for s in sequences:
        for start, length in s.replies:
            at.extend(range(offset + start - 1, offset + start - 1 + length))
        offset += len(s.ids)
    at_t = torch.tensor(at, device=device)
    hidden = body(input_ids=ids, position_ids=positions, cu_seq_lens_q=bounds, cu_seq_lens_k=bounds,
                  max_length_q=longest, max_length_k=longest, use_cache=False).last_hidden_state[0]
    logp = token_logps(head(hidden[at_t]), ids[0, at_t + 1], temperature)
    return list(logp.split([length for s in sequences for _, length in s.replies]))


def pack_episode(replies: Sequence[tuple[list[int], list[int]]]) -> list[Packed]:
    """The sequences of one episode's (prompt ids, sampled ids) replies, in play order: a reply whose prompt starts
    with the current sequence (the previous prompt and reply, as played) extends it; any other starts a sequence of
    its own (so a conversation that does not extend its prefix falls back to one sequence per reply)."""
    out: list[Packed] = []
    for prompt, sampled in replies:
        current = out[-1] if out else None
        if current is not None and prompt[: len(current.ids)] == current.ids:
            current.ids = list(prompt) + list(sampled)
            current.replies.append((len(prompt), len(sampled)))
        else:
            out.append(Packed(list(prompt) + list(sampled), [(len(prompt), len(sampled))]))
    return out
