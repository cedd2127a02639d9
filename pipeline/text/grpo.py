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
  anchor state form a step group; ``A_S = (G_t − mean_step-group G) / F``, 0 for a step alone in its state. The
  paper matches a step's raw observation; here the anchor is the **whole conversation before the step** (system and
  task messages, every earlier move and reply, retries excluded), because an environment's reply alone ("Yes.") is
  the same text in unrelated states. Every episode of a group shares its first state, so the first move is always
  compared within the group; later states are shared where the episodes' conversations are still identical.
- **turn**: step ``t`` of episode ``i`` gets ``(G_{i,t} − mean_j G_{j,t}) / F`` over the group's episodes ``j`` that
  reached a step ``t`` (0 where only one did): each step is compared with the same step of the other episodes,
  never with earlier or later ones (which would mostly measure how many steps were left).

A group whose steps all get 0 carries no signal and is skipped (trajectory: all returns equal).

**Loss** per sampled token (``token_loss``), with ``ρ = exp(logp − old)`` against the policy that played:
``−min(ρ·A, clip(ρ, 1 − ε, 1 + ε)·A)·w + β·KL``, KL = TRL's k3 ``exp(ref − logp) − (ref − logp) − 1``, ``w`` the
rollout correction's weight (1 without one). ``loss_type`` (TRL's names) says how token losses are averaged over an
optimizer step: ``dapo`` every sampled token of the step alike (the token-level mean; TRL's ``dapo`` and ``bnpo``
are this when a step is one batch); ``grpo`` each reply's own token mean, then the mean over replies (GRPO's
1/|o|); ``dr_grpo`` the sum over tokens divided by replies × ``max_new_tokens`` (Dr. GRPO's constant).

**Log-probs** are those of the distribution the sampler drew from: temperature, top-k, top-p and min-p applied to
the logits (transformers' own warpers, as ``pipeline.llm.sampler`` samples) and renormalised (``warped_logps``). A
token the current weights would no longer keep gets log-prob ``LOGP_FLOOR`` (ρ ≈ 0). They are computed only at the
positions of sampled tokens: the output layer runs on those hidden states alone (``reply_logps``).

**Rollout correction** (``rollout_weights``; Yao et al. 2025, TRL's ``vllm_importance_sampling`` formulas): the
ratio ``ρ_s = exp(old − sampler)`` of the trainer's log-prob at the weights that played to the sampler's own, per
token or per reply (the product of its tokens' ratios); ``tis`` weights each token by ``min(ρ_s, C)`` (TRL's
``token_truncate`` / ``sequence_truncate``), ``mask`` by ``ρ_s`` where ``1/C ≤ ρ_s ≤ C`` and 0 elsewhere (TRL's
``token_mask`` / ``sequence_mask`` with bounds [1/C, C]).

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
LOGP_FLOOR = -1e4  # a token outside the kept set of the current weights: ratio exp(-1e4 - old) = 0, finite grads
KL_LOG_RATIO_CAP = 20.0  # k3's exp(ref - logp) of a floored log-prob stays finite

Credit = Literal["trajectory", "gigpo", "turn"]
Scale = Literal["group", "batch", "none"]
LossType = Literal["dapo", "grpo", "dr_grpo"]


# -- credit ---------------------------------------------------------------------------------------------------
@dataclass
class Steps:
    """One episode's steps for credit: each step's reward and the state it acted in."""

    rewards: list[float]
    anchors: list[Hashable] = field(default_factory=list)


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
    """Turn credit of one group: each step's ``G_t`` against the same step ``t`` of the group's other episodes."""
    returns = [discounted_returns(e.rewards, gamma) for e in group]
    out = [[0.0] * len(g) for g in returns]
    for t in range(max((len(g) for g in returns), default=0)):
        reached = [i for i, g in enumerate(returns) if t < len(g)]
        for i, a in zip(reached, relative([returns[i][t] for i in reached], scale, batch_std), strict=True):
            out[i][t] = a
    return out


def gigpo_advantages(group: Sequence[Steps], gamma: float, omega: float, scale: Scale = "group",
                     batch_std: tuple[float, float] = (0.0, 0.0)) -> list[list[float]]:
    """GiGPO's ``A_E + ω·A_S`` for each step of one group (``batch_std``: of the returns, of the step returns)."""
    totals = [sum(e.rewards) for e in group]
    episode = relative(totals, scale, batch_std[0])
    returns = [discounted_returns(e.rewards, gamma) for e in group]
    clusters: dict[Hashable, list[tuple[int, int]]] = defaultdict(list)
    for i, e in enumerate(group):
        for t, anchor in enumerate(e.anchors):
            clusters[anchor].append((i, t))
    step = [[0.0] * len(g) for g in returns]
    for members in clusters.values():
        for (i, t), a in zip(members, relative([returns[i][t] for i, t in members], scale, batch_std[1]),
                             strict=True):
            step[i][t] = a
    return [[episode[i] + omega * a for a in step[i]] for i in range(len(group))]


def round_advantages(groups: Sequence[Sequence[Steps]], credit: Credit, gamma: float = 1.0, omega: float = 1.0,
                     scale: Scale = "group") -> list[list[list[float]] | None]:
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
            adv = gigpo_advantages(group, gamma, omega, scale, batch)
        elif credit == "turn":
            adv = turn_advantages(group, gamma, scale, batch[1])
        else:
            raise ValueError(f"grpo: no credit named {credit!r}")
        out.append(adv if adv is not None and any(a != 0.0 for e in adv for a in e) else None)
    return out


# -- the loss -----------------------------------------------------------------------------------------------
def token_loss(logp: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
               clip_eps: float, beta: float = 0.0, ref: torch.Tensor | None = None, loss_type: LossType = "dapo",
               max_tokens: int = 0, weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """The clipped GRPO loss over replies (each tensor ``[replies, tokens]``; ``advantages`` per reply or per
    token; ``weights`` the rollout correction's, per token), averaged as ``loss_type`` says (``max_tokens``:
    ``dr_grpo``'s generation budget per reply); with the fraction of tokens clipped and the mean KL."""
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    ratio = torch.exp(logp - old)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    if weights is not None:
        per_token = per_token * weights
    kl = torch.zeros_like(logp)
    if beta > 0:
        if ref is None:
            raise ValueError("grpo: beta > 0 needs the reference log-probs")
        log_ratio = (ref - logp).clamp(-KL_LOG_RATIO_CAP, KL_LOG_RATIO_CAP)
        kl = torch.exp(log_ratio) - log_ratio - 1
        per_token = per_token + beta * kl
    n = mask.sum().clamp(min=1)
    if loss_type == "dapo":
        loss = (per_token * mask).sum() / n
    elif loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    elif loss_type == "dr_grpo":
        if max_tokens < 1:
            raise ValueError("grpo: loss_type dr_grpo needs the generation budget (max_tokens)")
        loss = (per_token * mask).sum() / (logp.shape[0] * max_tokens)
    else:
        raise ValueError(f"grpo: no loss_type named {loss_type!r}")
    with torch.no_grad():
        stats = {"clipped": float(((clipped < unclipped).float() * mask).sum() / n), "kl": float((kl * mask).sum() / n)}
    return loss, stats


def rollout_weights(old: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor, mode: str, level: str,
                    cap: float) -> tuple[torch.Tensor | None, dict]:
    """The rollout correction's weight per token (None for ``none``) from the trainer's log-probs at the weights
    that played (``old``) and the sampler's, ``[replies, tokens]``; with the gap's statistics: mean and max
    |Δ log p| per token and the share of tokens whose weight the correction changed."""
    diff = (old - sampler) * mask
    n = mask.sum().clamp(min=1)
    stats = {"gap_mean": float(diff.abs().sum() / n), "gap_max": float(diff.abs().max()) if diff.numel() else 0.0,
             "tokens": int(mask.sum()), "corrected": 0.0}
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
    stats["corrected"] = float((changed.float() * mask).sum() / n)
    return weights * mask, stats


# -- log-probs of the sampled tokens, where they are used ---------------------------------------------------
def warped_logps(logits: torch.Tensor, targets: torch.Tensor, warpers: Sequence) -> torch.Tensor:
    """log-prob of each ``targets`` token under the sampler's distribution: ``warpers`` (temperature, top-k, top-p,
    min-p: transformers' logits processors, as ``pipeline.llm.sampler.sampling_warpers`` builds them) applied to the
    rows of ``logits`` ``[tokens, vocab]`` and renormalised; ``LOGP_FLOOR`` for a token they remove."""
    scores = logits.float()
    for warp in warpers:
        scores = warp(None, scores)
    logp = torch.log_softmax(scores, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    return logp.clamp(min=LOGP_FLOOR)


def decoder_and_head(model) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The transformer body and the output layer of a causal LM (a PEFT model's too: its adapters sit inside)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(inner, inner.base_model_prefix), inner.get_output_embeddings()


@dataclass
class Packed:
    """Token ids of one sequence and where its scored replies sit: (start, length) of each, in order."""

    ids: list[int]
    replies: list[tuple[int, int]]


def reply_logps(model, sequences: Sequence[Packed], warpers: Sequence = ()) -> list[torch.Tensor]:
    """Per scored reply of ``sequences``, in order, the log-prob of each of its tokens given everything before it
    in its sequence (``warped_logps``): one padding-free forward of the sequences side by side in one row, the
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
    logp = warped_logps(head(hidden[at_t]), ids[0, at_t + 1], warpers)
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
