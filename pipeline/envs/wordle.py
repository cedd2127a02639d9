"""Wordle: guess a five-letter word in six tries from per-letter feedback (a program engine).

Rules chosen here: a guess that is not five letters, or not in the word list, gets a message and still costs
a try (PAPRIKA counts every turn). Feedback marks each letter G (right spot), Y (elsewhere in the word) or X,
with repeated letters marked at most as many times as the secret holds them, greens first.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field

from pipeline.envs.base import Split, StepResult, Task, register
from pipeline.envs.gamekit import Episode, TextGame, load_lines, seeded, task_id

WORDS: tuple[str, ...] = load_lines("wordle_words.txt")
_WORD_SET = frozenset(WORDS)
_FEEDBACK_RE = re.compile(r"\b([a-z]{5}): ([GYX]{5})\b")
# Letters that are rare in English five-letter words: secrets holding them are harder to find.
_RARE_LETTERS = set("jqxzvkw")
_OPENERS = ("slate", "crane", "trace", "stare", "arise", "raise")


def feedback(secret: str, guess: str) -> str:
    """Marks for ``guess`` against ``secret``: greens first, then yellows while unmatched copies remain."""
    marks = ["X"] * len(guess)
    unmatched: Counter[str] = Counter()
    for i, (s, g) in enumerate(zip(secret, guess, strict=True)):
        if s == g:
            marks[i] = "G"
        else:
            unmatched[s] += 1
    for i, g in enumerate(guess):
        if marks[i] != "G" and unmatched[g] > 0:
            marks[i] = "Y"
            unmatched[g] -= 1
    return "".join(marks)


# How many list words share each "one letter blanked" pattern, e.g. "_ight" -> light, might, night, ...
_ONE_OFF: Counter[str] = Counter(w[:i] + "_" + w[i + 1:] for w in WORDS for i in range(5))


def one_letter_neighbours(word: str) -> int:
    """Words of the list that differ from ``word`` in exactly one position."""
    return sum(_ONE_OFF[word[:i] + "_" + word[i + 1:]] - 1 for i in range(5))


def difficulty(word: str, rank: int) -> str:
    """easy / medium / hard from what makes a secret slow to pin down.

    One point each for: a repeated letter, a rare letter, five or more one-letter neighbours (the "_ight"
    trap) and a frequency rank past 1000.
    """
    points = (
        (len(set(word)) < 5)
        + bool(_RARE_LETTERS & set(word))
        + (one_letter_neighbours(word) >= 5)
        + (rank >= 1000)
    )
    return "easy" if points == 0 else "medium" if points == 1 else "hard"


@dataclass
class WordleState(Episode):
    guesses: list[str] = field(default_factory=list)


@register
class Wordle(TextGame):
    name = "wordle"
    max_turns = 6

    def __init__(self, environment=None) -> None:
        super().__init__(environment)
        self._consistent_cache: dict[tuple[tuple[str, str], ...], tuple[str, ...]] = {}

    def make_tasks(self, split: Split) -> list[Task]:
        pool = list(enumerate(WORDS[: self.config["secret_pool"]]))
        seeded(self.name, "split").shuffle(pool)
        n_eval = self.config["eval_tasks"]
        chosen = pool[:n_eval] if split == "eval" else pool[n_eval:]
        agent = self.config["agent"]
        return [
            Task(self.name, task_id(self.name, split, i), word, agent, difficulty(word, rank), split)
            for i, (rank, word) in enumerate(chosen)
        ]

    def reset(self, task: Task, rng: random.Random) -> WordleState:
        return WordleState(task=task)

    def play(self, state: WordleState, action: str) -> StepResult:
        guess = action.lower().strip().strip(".!\"'")
        if len(guess) != 5 or not guess.isalpha():
            return StepResult(self.prompts("invalid_length"), done=False, info={"invalid": True})
        if guess not in _WORD_SET:
            return StepResult(self.prompts("invalid_word", guess=guess), done=False, info={"invalid": True})
        state.guesses.append(guess)
        if guess == state.task.env:
            return StepResult(self.prompts("solved", guess=guess), done=True, success=True)
        marks = feedback(state.task.env, guess)
        return StepResult(self.prompts("feedback", guess=guess, marks=marks), done=False)

    def is_correct_guess(self, task: Task, action: str) -> bool:
        return action.strip().lower() == task.env

    # -- scripted player ---------------------------------------------------------------------------------
    def consistent_words(self, history: list[tuple[str, str]]) -> tuple[str, ...]:
        """Words of the list that agree with every piece of feedback in ``history``."""
        clues = tuple((m.group(1), m.group(2)) for _, reply in history if (m := _FEEDBACK_RE.search(reply)))
        return self._consistent(clues)

    def _consistent(self, clues: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
        if not clues:
            return WORDS
        if clues not in self._consistent_cache:
            if len(self._consistent_cache) > 20_000:
                self._consistent_cache.clear()
            guess, marks = clues[-1]
            self._consistent_cache[clues] = tuple(
                w for w in self._consistent(clues[:-1]) if feedback(w, guess) == marks
            )
        return self._consistent_cache[clues]

    def scripted_action(self, task: Task, history: list[tuple[str, str]], rng: random.Random, noise: float) -> str:
        if rng.random() < noise:
            return rng.choice(WORDS)  # ignores everything learnt so far
        if not history:
            return rng.choice([w for w in _OPENERS if w in _WORD_SET])
        tried = {a.strip().lower() for a, _ in history}
        candidates = [w for w in self.consistent_words(history) if w not in tried]
        if not candidates:
            return rng.choice(WORDS)
        if len(candidates) <= 2:
            return rng.choice(candidates)
        # Among (a sample of) the candidates, guess the one whose feedback splits the rest into most groups.
        probes = rng.sample(candidates, min(len(candidates), 60))
        targets = candidates if len(candidates) <= 200 else rng.sample(candidates, 200)
        return max(probes, key=lambda g: (len({feedback(t, g) for t in targets}), rng.random()))
