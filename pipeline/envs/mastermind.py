"""Mastermind with 4 digits (0-9, repeats allowed), PAPRIKA's variant: black and white pegs, 12 tries.

Black counts positions where guess and code agree; white counts the remaining digits that occur in both,
each digit at most as often as it occurs in the code (so duplicates are never double counted).
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass

from pipeline.envs.base import Split, StepResult, Task, register
from pipeline.envs.gamekit import DIFFICULTIES, Episode, TextGame, per_difficulty, seeded, task_id

LENGTH = 4
ALL_CODES: tuple[str, ...] = tuple("".join(p) for p in itertools.product("0123456789", repeat=LENGTH))
_FEEDBACK_RE = re.compile(r"\b(\d{4}): (\d) black, (\d) white")


def pegs(code: str, guess: str) -> tuple[int, int]:
    """(black, white) for ``guess`` against ``code``."""
    black = sum(c == g for c, g in zip(code, guess, strict=True))
    common = sum(min(code.count(d), guess.count(d)) for d in set(guess))
    return black, common - black


def difficulty(code: str) -> str:
    """Repeated digits are what make codes hard: 4 distinct digits easy, one repeat medium, more hard."""
    return {4: "easy", 3: "medium"}.get(len(set(code)), "hard")


@dataclass
class MastermindState(Episode):
    pass


@register
class Mastermind(TextGame):
    name = "mastermind"
    max_turns = 12

    def __init__(self, environment=None) -> None:
        super().__init__(environment)
        self._consistent_cache: dict[tuple[tuple[str, int, int], ...], tuple[str, ...]] = {}

    def make_tasks(self, split: Split) -> list[Task]:
        # One shuffle of all codes, cut per difficulty: eval takes each class's head, train what follows.
        codes = list(ALL_CODES)
        seeded(self.name, "codes").shuffle(codes)
        n_eval = per_difficulty(self.config["tasks"]["eval"])
        n_train = per_difficulty(self.config["tasks"]["train"])
        chosen: list[str] = []
        for level in DIFFICULTIES:
            pool = [c for c in codes if difficulty(c) == level]
            cut = n_eval[level]
            chosen += pool[:cut] if split == "eval" else pool[cut: cut + n_train[level]]
        seeded(self.name, split).shuffle(chosen)
        return [
            Task(self.name, task_id(self.name, split, i), code, self.config["agent"], difficulty(code), split)
            for i, code in enumerate(chosen)
        ]

    def prompt_fields(self, task: Task) -> dict:
        return {**super().prompt_fields(task), "length": LENGTH}

    def reset(self, task: Task, rng: random.Random) -> MastermindState:
        return MastermindState(task=task)

    def play(self, state: MastermindState, action: str) -> StepResult:
        guess = re.sub(r"[\s,.-]", "", action)
        if len(guess) != LENGTH or not guess.isdigit():
            return StepResult(self.prompts("invalid", length=LENGTH), done=False, info={"invalid": True})
        if guess == state.task.env:
            return StepResult(self.prompts("solved", guess=guess, length=LENGTH), done=True, success=True)
        black, white = pegs(state.task.env, guess)
        return StepResult(self.prompts("feedback", guess=guess, black=black, white=white), done=False)

    def is_correct_guess(self, task: Task, action: str) -> bool:
        return re.sub(r"[\s,.-]", "", action) == task.env

    # -- scripted player: a random code consistent with all feedback so far ----------------------------------
    def consistent_codes(self, history: list[tuple[str, str]]) -> tuple[str, ...]:
        found = (_FEEDBACK_RE.search(reply) for _, reply in history)
        clues = tuple((m.group(1), int(m.group(2)), int(m.group(3))) for m in found if m)
        return self._consistent(clues)

    def _consistent(self, clues: tuple[tuple[str, int, int], ...]) -> tuple[str, ...]:
        if not clues:
            return ALL_CODES
        if clues not in self._consistent_cache:
            if len(self._consistent_cache) > 20_000:
                self._consistent_cache.clear()
            guess, black, white = clues[-1]
            self._consistent_cache[clues] = tuple(
                c for c in self._consistent(clues[:-1]) if pegs(c, guess) == (black, white)
            )
        return self._consistent_cache[clues]

    def scripted_action(self, task: Task, history: list[tuple[str, str]], rng: random.Random, noise: float) -> str:
        if rng.random() < noise:
            return rng.choice(ALL_CODES)
        if not history:
            a, b = rng.sample("0123456789", 2)  # the classic "aabb" opener
            return a + a + b + b
        tried = {a.strip() for a, _ in history}
        candidates = [c for c in self.consistent_codes(history) if c not in tried]
        return rng.choice(candidates) if candidates else rng.choice(ALL_CODES)
