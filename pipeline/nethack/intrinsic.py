"""The Motif / ONI intrinsic reward, as a per-env object the env wrapper calls once per step.

    r = ext_coef · r_ext + int_coef · 1[r̃(m) > ε] · r̃(m) / N_ep(m)^β

r̃ is the reward model's output for the step's message m, normalised by the training statistics; N_ep(m) counts
how often m has appeared in the current episode, this step included, and restarts every episode; ε is a
quantile of r̃ over the training messages, or no threshold at all (``threshold=None``).

The reward model is never run per step: :class:`MessageRewards` scores messages in batches and caches r̃ by
message text (the same few thousand messages make up nearly every step), so a step costs a dict lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from pipeline.models.reward_net_config import MOTIF_COUNT_EXPONENT


class MessageRewards:
    """r̃ by message, computed in batches by the reward model and cached."""

    def __init__(self, score: Callable[[list[str]], np.ndarray], max_cached: int = 1_000_000) -> None:
        self._score = score  # raw texts -> normalised rewards
        self._cache: dict[str, float] = {}
        self._max_cached = max_cached
        self.misses = 0

    @classmethod
    def from_directory(cls, directory: str | Path) -> MessageRewards:
        import torch

        from pipeline.nethack.reward import load_reward_model  # torch, as above: only with a reward model

        model, stats = load_reward_model(directory)
        # One thread: this runs inside sample-factory's rollout workers, which already share the cores.
        torch.set_num_threads(1)
        return cls(lambda texts: np.asarray(stats.normalize(model.score(texts)), dtype=np.float64))

    def preload(self, values: dict[str, float]) -> None:
        """Take r̃ already computed elsewhere (the train-reward stage's table of training messages)."""
        self._cache.update(values)

    def prefill(self, messages: Iterable[str]) -> None:
        """Score every not-yet-cached message in one batch (e.g. all messages of the training rollouts)."""
        todo = list(dict.fromkeys(m for m in messages if m not in self._cache))
        if todo:
            self._cache.update(zip(todo, self._score(todo).tolist(), strict=True))

    def __call__(self, message: str) -> float:
        value = self._cache.get(message)
        if value is None:
            self.misses += 1
            if len(self._cache) >= self._max_cached:
                self._cache.clear()
            value = float(self._score([message])[0])
            self._cache[message] = value
        return value

    def __len__(self) -> int:
        return len(self._cache)


class EpisodicIntrinsicReward:
    """Combines extrinsic and intrinsic reward for one env; keeps the per-episode message counts."""

    def __init__(
        self,
        rewards: Callable[[str], float] | None,
        *,
        ext_coef: float,
        int_coef: float,
        count_exponent: float = MOTIF_COUNT_EXPONENT,
        threshold: float | None = None,
    ) -> None:
        if int_coef != 0 and rewards is None:
            raise ValueError("int_coef != 0 needs a reward model")
        self.rewards = rewards
        self.ext_coef = ext_coef
        self.int_coef = int_coef
        self.count_exponent = count_exponent
        self.threshold = threshold
        self.counts: dict[str, int] = {}

    def reset(self) -> None:
        self.counts.clear()

    def intrinsic(self, message: str) -> float:
        """1[r̃ > ε] · r̃ / N_ep(m)^β for this occurrence of ``message`` (and count it)."""
        if self.int_coef == 0 or self.rewards is None:
            return 0.0  # extrinsic-only: not even counting, so it costs nothing per step
        n = self.counts.get(message, 0) + 1
        self.counts[message] = n
        r = self.rewards(message)
        if self.threshold is not None and not r > self.threshold:
            return 0.0
        return r / n**self.count_exponent

    def step(self, message: str, r_ext: float) -> tuple[float, float]:
        """(total reward, unscaled intrinsic reward) of one step."""
        r_int = self.intrinsic(message)
        return self.ext_coef * r_ext + self.int_coef * r_int, r_int
