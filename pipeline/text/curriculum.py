"""PAPRIKA's curriculum: play more of the task difficulties the policy is still learning from.

A task's learning potential is the coefficient of variation of its turn counts over k sampled trajectories
(failures counted as the game's max turns), with the small-sample correction (1 + 1/(4n))·s/μ: a task the
policy always wins in the same number of turns, or always loses, teaches little. The arms of a UCB bandit are
the difficulty labels; an arm's value is the mean potential of its tasks seen so far, plus the exploration
bonus α·√(2 ln N / n_arm). ``select`` picks the best arm, then a task uniformly inside it.

Pulls are counted when a task is selected, not when its potential arrives, so one batch of selections
spreads over the arms the way one-at-a-time play would. The whole state is a JSON-able dict, so a run that is
stopped and resumed makes the same choices as one that is not.

:class:`OnlineCurriculum` picks the tasks of each round of an online loop (rl-text,
``rl_text.curriculum.enabled``) from the learning policy's own rollouts of the rounds before.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pipeline.envs.base import Task

DIFFICULTY_ORDER = ("easy", "medium", "hard")


def learning_potential(turns: Sequence[float]) -> float:
    """Unbiased coefficient of variation (1 + 1/(4n))·s/|μ| of one task's scores over its n samples.

    ``s`` is the sample standard deviation (n − 1). Zero when there are fewer than two samples or the mean is
    zero (the ratio is undefined there, and such a task shows no spread to learn from).
    """
    n = len(turns)
    if n < 2:
        return 0.0
    mean = statistics.fmean(turns)
    if mean == 0:
        return 0.0
    return (1 + 1 / (4 * n)) * statistics.stdev(turns) / abs(mean)


def turns_with_failures(turns: Sequence[int], successes: Sequence[bool], max_turns: int) -> list[int]:
    """Turn counts with every failed trajectory counted as ``max_turns`` (PAPRIKA's convention)."""
    return [t if ok else max_turns for t, ok in zip(turns, successes, strict=True)]


class UCBCurriculum:
    """UCB over difficulty arms; tasks chosen uniformly inside the chosen arm.

    Args:
        tasks: ``Task`` objects or a mapping task id -> difficulty label.
        alpha: weight of the exploration bonus.
    """

    def __init__(self, tasks: Iterable[Task] | Mapping[str, str], alpha: float = 1.0) -> None:
        difficulty = dict(tasks) if isinstance(tasks, Mapping) else {t.task_id: t.difficulty for t in tasks}
        if not difficulty:
            raise ValueError("the curriculum needs at least one task")
        self.alpha = alpha
        self.arm_of: dict[str, str] = difficulty
        labels = set(difficulty.values())
        ordered = [a for a in DIFFICULTY_ORDER if a in labels] + sorted(labels - set(DIFFICULTY_ORDER))
        self.arms: dict[str, list[str]] = {a: sorted(t for t, d in difficulty.items() if d == a) for a in ordered}
        self.pulls = dict.fromkeys(self.arms, 0)
        self.potential_sum = dict.fromkeys(self.arms, 0.0)
        self.potential_count = dict.fromkeys(self.arms, 0)
        self.task_potential: dict[str, float] = {}

    def mean_potential(self, arm: str) -> float:
        count = self.potential_count[arm]
        return self.potential_sum[arm] / count if count else 0.0

    def arm_scores(self) -> dict[str, float]:
        """UCB score per arm; ``inf`` for arms never pulled (they go first)."""
        total = sum(self.pulls.values())
        return {
            arm: math.inf if n == 0
            else self.mean_potential(arm) + self.alpha * math.sqrt(2 * math.log(total) / n)
            for arm, n in self.pulls.items()
        }

    def select(self, rng: random.Random, n: int) -> list[str]:
        """``n`` task ids: each from the arm with the highest UCB score (ties broken by ``rng``).

        Within one call a task repeats only once its arm has no unused task left.
        """
        chosen: list[str] = []
        used: dict[str, set[str]] = {arm: set() for arm in self.arms}
        for _ in range(n):
            scores = self.arm_scores()
            best = max(scores.values())
            arm = rng.choice([a for a, s in scores.items() if s == best])
            self.pulls[arm] += 1
            fresh = [t for t in self.arms[arm] if t not in used[arm]]
            task = rng.choice(fresh or self.arms[arm])
            used[arm].add(task)
            chosen.append(task)
        return chosen

    def update(self, task_id: str, turns: Sequence[float]) -> float:
        """Record the scores of a task's sampled trajectories (failures already at max turns); returns the
        task's learning potential."""
        if task_id not in self.arm_of:
            raise KeyError(f"task {task_id!r} is not in this curriculum")
        potential = learning_potential(turns)
        arm = self.arm_of[task_id]
        self.potential_sum[arm] += potential
        self.potential_count[arm] += 1
        self.task_potential[task_id] = potential
        return potential

    def state_dict(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "arms": {arm: len(ids) for arm, ids in self.arms.items()},
            "pulls": dict(self.pulls),
            "potential_sum": dict(self.potential_sum),
            "potential_count": dict(self.potential_count),
            "task_potential": dict(self.task_potential),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a saved state; it must come from a curriculum over the same arms and tasks."""
        arms = {arm: len(ids) for arm, ids in self.arms.items()}
        if dict(state["arms"]) != arms:
            raise ValueError(f"saved curriculum arms {dict(state['arms'])} do not match these tasks' {arms}")
        unknown = set(state["task_potential"]) - set(self.arm_of)
        if unknown:
            raise ValueError(f"saved curriculum has tasks not in this task set, e.g. {sorted(unknown)[:3]}")
        self.alpha = float(state["alpha"])
        self.pulls = {arm: int(state["pulls"][arm]) for arm in self.arms}
        self.potential_sum = {arm: float(state["potential_sum"][arm]) for arm in self.arms}
        self.potential_count = {arm: int(state["potential_count"][arm]) for arm in self.arms}
        self.task_potential = {k: float(v) for k, v in state["task_potential"].items()}


def task_key(group: str, task_id: str) -> str:
    return f"{group}/{task_id}"


def round_samples(picked: Sequence[str], k: int) -> list[tuple[str, int]]:
    """A round's (task key, sample): k samples per pick; a task picked twice gets samples k..2k-1 the second time."""
    seen: Counter[str] = Counter()
    out = []
    for key in picked:
        first = seen[key] * k
        seen[key] += 1
        out.extend((key, first + s) for s in range(k))
    return out


def update_from_round(curriculum: UCBCurriculum, picked: Sequence[str], rows: list[dict], k: int, where: str,
                      hint: str = "") -> None:
    """Update the arms with a round's rows (``group``, ``task_id``, ``sample``, ``score``): one learning potential
    per pick, from its k scores in sample order. RuntimeError (``where`` and ``hint`` in it) if the rows do not hold
    exactly the k episodes of each pick."""
    scores: dict[tuple[str, int], list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        scores[(task_key(r["group"], r["task_id"]), r["sample"] // k)].append((r["sample"], r["score"]))
    seen: Counter[str] = Counter()
    for key in picked:
        got = sorted(scores.pop((key, seen[key]), []))
        seen[key] += 1
        if len(got) != k:
            raise RuntimeError(f"{where} holds {len(got)} episodes of {key}, the curriculum expected {k}{hint}")
        curriculum.update(key, [s for _, s in got])
    if scores:
        raise RuntimeError(f"{where} holds tasks the curriculum did not pick, e.g. {next(iter(scores))[0]}{hint}")


class OnlineCurriculum:
    """Each round's picks of an online loop whose policy changes between rounds (rl-text).

    Round i's picks = a fresh curriculum, then for each round j < i: ``select`` with round j's rng and
    ``update`` with the learning potential of each pick's k episodes in round j's rows (the policy's own rollouts,
    as that round played them), then ``select`` with round i's rng. Rebuilt from the rows every time, so a
    resumed run picks exactly what an uninterrupted one does.

    Args:
        arm_of: task key (:func:`task_key`) -> arm.
        per_round: tasks picked per round; each is played ``k`` times.
        rng_of: round index -> the round's own ``random.Random``.
        rows_of: round index -> that round's episode rows (``group``, ``task_id``, ``sample``, ``score``).
    """

    def __init__(self, arm_of: Mapping[str, str], alpha: float, per_round: int, k: int,
                 rng_of: Callable[[int], random.Random], rows_of: Callable[[int], list[dict]]) -> None:
        self.arm_of, self.alpha, self.per_round, self.k = dict(arm_of), alpha, per_round, k
        self.rng_of, self.rows_of = rng_of, rows_of

    def state_before(self, index: int) -> UCBCurriculum:
        curriculum = UCBCurriculum(self.arm_of, alpha=self.alpha)
        for r in range(index):
            picked = curriculum.select(self.rng_of(r), self.per_round)
            self._update(curriculum, r, picked, self.rows_of(r))
        return curriculum

    def picks(self, index: int) -> list[str]:
        """Round ``index``'s task keys, in pick order (a key may repeat once its arm has no unused task)."""
        return self.state_before(index).select(self.rng_of(index), self.per_round)

    def episodes(self, index: int) -> list[tuple[str, int]]:
        """Round ``index``'s (task key, sample): k samples per pick; a task picked twice gets samples k..2k-1."""
        return round_samples(self.picks(index), self.k)

    def _update(self, curriculum: UCBCurriculum, index: int, picked: list[str], rows: list[dict]) -> None:
        update_from_round(curriculum, picked, rows, self.k, f"curriculum round {index}")
