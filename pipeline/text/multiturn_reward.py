"""The CollabLLM-style multi-turn-aware reward used to build per-turn preference pairs.

For each candidate next turn, a few forward-simulated continuations are scored and averaged:

    R = w_llm · mean(interactivity, information gain) + w_task · accuracy − min(w_cost · tokens, 1)

with w_llm = w_task = 1 and w_cost = 5e-4. Chosen = the candidate with the highest mean R, rejected = the one
with the lowest. Every dimension lives in [0, 1]. Information gain can come from a judge or, for games with a
knowledge base (twenty questions, guess my city), exactly: the entropy drop over the candidates that are
still consistent with the conversation, as a share of the entropy before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
History = Sequence[tuple[str, str]]  # (agent move, environment reply) pairs
#: Any knowledge base plugs in as "which secrets are still possible after this conversation".
ConsistentCandidates = Callable[[History], Collection[Hashable]]

#: The judge's accuracy labels and their scores (CollabLLM's 20Q judge).
ACCURACY_SCORES: dict[str, float] = {"correct": 1.0, "very close": 0.9, "plausible": 0.4, "wrong": 0.0}


@dataclass(frozen=True)
class RewardWeights:
    llm: float = 1.0
    """w_llm: weight of mean(interactivity, information gain)."""
    task: float = 1.0
    """w_task: weight of task accuracy."""
    cost: float = 5e-4
    """w_cost: penalty per token (capped at 1 in total)."""


def multiturn_aware_reward(
    accuracy: float,
    interactivity: float,
    information_gain: float,
    tokens: int,
    weights: RewardWeights = RewardWeights(),
) -> float:
    """R for one forward-simulated continuation; the three scores must already be in [0, 1]."""
    for name, value in (("accuracy", accuracy), ("interactivity", interactivity),
                        ("information_gain", information_gain)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    engagement = (interactivity + information_gain) / 2
    return weights.llm * engagement + weights.task * accuracy - min(weights.cost * tokens, 1.0)


def judge_score(raw: float, scale: tuple[float, float] = (0.0, 1.0)) -> float:
    """A judge's score mapped onto [0, 1] from the scale the judge was asked to use.

    Scores asked for on [0, 1] come back unchanged. (The published 20Q code applied a 1-4 rescale, (x − 1)/3,
    to [0, 1] scores, which turns them negative; Curio rescales only from the scale actually used.)
    """
    low, high = scale
    if high <= low:
        raise ValueError(f"bad judge scale {scale}")
    if not low <= raw <= high:
        raise ValueError(f"judge score {raw} is outside its scale {scale}")
    return (raw - low) / (high - low)


def entropy(candidates: Collection[Hashable], prior: Mapping[Hashable, float] | None = None) -> float:
    """Entropy in bits of the secret, uniform over ``candidates`` or proportional to ``prior`` on them."""
    if not candidates:
        return 0.0
    if prior is None:
        return math.log2(len(candidates))
    mass = [prior.get(c, 0.0) for c in candidates]
    total = sum(mass)
    if total <= 0:
        raise ValueError("the prior gives no mass to any candidate")
    return -sum(m / total * math.log2(m / total) for m in mass if m > 0)


def information_gain(
    candidates_before: Collection[Hashable],
    candidates_after: Collection[Hashable],
    prior: Mapping[Hashable, float] | None = None,
) -> float:
    """Share of the uncertainty about the secret removed between two points of a conversation, in [0, 1].

    (H(before) − H(after)) / H(before). Zero when nothing was uncertain before, and zero when no candidate
    is left (the answers contradict each other, so they carry no usable information).
    """
    before = set(candidates_before)
    after = set(candidates_after) & before
    h_before = entropy(before, prior)
    if h_before == 0 or not after:
        return 0.0
    return min(1.0, max(0.0, (h_before - entropy(after, prior)) / h_before))


def exact_information_gain(
    consistent: ConsistentCandidates,
    history_before: History,
    history_after: History,
    prior: Mapping[Hashable, float] | None = None,
) -> float:
    """Information gain of the turns between ``history_before`` and ``history_after``, read off a knowledge
    base through ``consistent`` (e.g. ``GuessMyCity.candidates``)."""
    return information_gain(consistent(history_before), consistent(history_after), prior)


@dataclass(frozen=True)
class TurnPreference(Generic[T]):
    chosen: T
    rejected: T
    chosen_reward: float
    rejected_reward: float
    mean_rewards: tuple[float, ...]
    """Mean reward of every candidate, in the order given."""


def prefer_turn(
    candidates: Sequence[T], continuation_rewards: Sequence[Sequence[float]], min_margin: float = 0.0
) -> TurnPreference[T] | None:
    """Average each candidate's continuation rewards; chosen = argmax, rejected = argmin (first on ties).

    None when the best and worst means are no more than ``min_margin`` apart (no preference to learn).
    """
    if len(candidates) != len(continuation_rewards):
        raise ValueError(f"{len(candidates)} candidates but {len(continuation_rewards)} reward lists")
    if len(candidates) < 2:
        raise ValueError("a preference needs at least two candidates")
    if any(len(r) == 0 for r in continuation_rewards):
        raise ValueError("every candidate needs at least one scored continuation")
    means = tuple(sum(r) / len(r) for r in continuation_rewards)
    best = max(range(len(means)), key=lambda i: means[i])
    worst = min(range(len(means)), key=lambda i: means[i])
    if means[best] - means[worst] <= min_margin:
        return None
    return TurnPreference(candidates[best], candidates[worst], means[best], means[worst], means)
