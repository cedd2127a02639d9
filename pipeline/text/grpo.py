"""GRPO for multi-turn play: group-relative advantages over the K episodes of one task, no critic.

The formulas follow DeepSeekMath's GRPO (Shao et al. 2024) as TRL's ``GRPOTrainer`` computes them:

- **Trajectory credit** (StarPO-style): a group is the K episodes of one task in a round, ``R`` each episode's
  return; ``A = (R − mean(R)) / (std(R) + 1e-4)`` with the sample standard deviation (TRL's
  ``rewards.std(dim=1)``); every token of the episode's replies gets its episode's ``A``. A group whose
  returns are all equal carries no signal and is skipped (``None``).
- **Turn credit**: each reply ``t`` of an episode gets the discounted return ``G_t = r_t + γ·G_{t+1}`` of the
  per-turn rewards (``rl_text.reward``'s, plus the game's outcome reward on the last turn, weighted); the
  ``G_t`` of every turn of the group's episodes are normalised together, ``(G_t − mean) / (std + 1e-4)``.
- **Loss** per reply token, against the log-prob the playing policy gave it (``old``) and optionally a reference
  policy (``ref``): ``ρ = exp(logp − old)``, ``−min(ρ·A, clip(ρ, 1 − ε, 1 + ε)·A) + β·KL`` with TRL's KL estimator
  ``exp(ref − logp) − (ref − logp) − 1`` (Schulman's k3); averaged over every reply token of the batch (DAPO's
  token-level mean, TRL's ``loss_type="dapo"``).

The tokens trained on are the ids the policy sampled (``turn_token_ids`` of the rollout rows), never the reply's
text tokenized again; the prompt of each reply is the conversation before it rendered by the chat template, as
the hf backend rendered it to play. Only those sampled ids carry loss: no template token, no environment token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

STD_EPS = 1e-4  # TRL's: (r - mean) / (std + 1e-4)


def group_advantages(returns: Sequence[float]) -> list[float] | None:
    """``(R − mean) / (std + 1e-4)`` over one group (sample std); None when every return is the same."""
    if len(returns) < 2 or max(returns) == min(returns):
        return None
    mean = sum(returns) / len(returns)
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / (len(returns) - 1))
    return [(r - mean) / (std + STD_EPS) for r in returns]


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """``G_t = r_t + γ·G_{t+1}``, from the last turn back."""
    out, running = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def turn_advantages(group_rewards: Sequence[Sequence[float]], gamma: float) -> list[list[float]] | None:
    """Per episode of a group, each turn's advantage: its discounted return normalised over every turn of the
    group's episodes; None when every return is the same."""
    returns = [discounted_returns(r, gamma) for r in group_rewards]
    flat = group_advantages([g for episode in returns for g in episode])
    if flat is None:
        return None
    out, start = [], 0
    for episode in returns:
        out.append(flat[start:start + len(episode)])
        start += len(episode)
    return out


def token_loss(logp: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
               clip_eps: float, beta: float = 0.0, ref: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """The clipped GRPO loss over a batch of token rows (each tensor ``[rows, tokens]``; ``advantages`` per row
    or per token), averaged over the ``mask``ed tokens; with the fraction clipped and the mean KL."""
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    ratio = torch.exp(logp - old)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    kl = torch.zeros_like(logp)
    if beta > 0:
        if ref is None:
            raise ValueError("grpo: beta > 0 needs the reference log-probs")
        kl = torch.exp(ref - logp) - (ref - logp) - 1
        per_token = per_token + beta * kl
    n = mask.sum().clamp(min=1)
    loss = (per_token * mask).sum() / n
    with torch.no_grad():
        stats = {"clipped": float(((clipped < unclipped).float() * mask).sum() / n), "kl": float((kl * mask).sum() / n)}
    return loss, stats


def reply_sequences(tokenizer, conversation: list[dict], turn_token_ids: list[list[int]], max_positions: int,
                    max_new_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, sampled reply ids) of each agent reply of a played conversation: the prompt is the
    conversation before the reply rendered with the generation prompt (as the hf backend played it), the reply
    the ids the policy sampled."""
    from pipeline.models.chat import encode_prompt

    starts = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
    if len(starts) != len(turn_token_ids):
        raise ValueError(f"{len(starts)} agent replies but {len(turn_token_ids)} sampled id lists")
    return [(encode_prompt(tokenizer, conversation[:i], max_positions, max_new_tokens), list(ids))
            for i, ids in zip(starts, turn_token_ids, strict=True)]


def reply_logps(model, sequences: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per reply token, log π(token | prompt, reply so far), ``[rows, longest reply]``, and the reply-token mask
    (1 on the sampled ids only)."""
    width = max(len(p) + len(c) for p, c in sequences)
    reply = max(len(c) for _, c in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    for k, (p, c) in enumerate(sequences):
        ids[k, :len(p) + len(c)] = torch.tensor(p + c)
        attention[k, :len(p) + len(c)] = 1
    logits = model(input_ids=ids, attention_mask=attention).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    out = torch.zeros((len(sequences), reply))
    mask = torch.zeros((len(sequences), reply))
    for k, (p, c) in enumerate(sequences):
        out[k, :len(c)] = logp[k, len(p) - 1:len(p) - 1 + len(c)]
        mask[k, :len(c)] = 1
    return out, mask
