"""Plumbing shared by the text games: data files, prompt templates, turn bookkeeping, grid coordinates.

Every game keeps its prompts in ``data/<game>.json`` under ``"prompts"`` (``str.format`` templates), so
rewording a prompt is a data edit, not a code edit.
"""

from __future__ import annotations

import functools
import json
import random
import re
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.envs.base import Game, Split, StepResult, Task

DATA_DIR = Path(__file__).parent / "data"
DIFFICULTIES = ("easy", "medium", "hard")


@functools.cache
def load_json(name: str) -> Any:
    """A JSON file from ``pipeline/envs/data`` (cached; treat the result as read-only)."""
    return json.loads((DATA_DIR / name).read_text(encoding="utf-8"))


@functools.cache
def load_lines(name: str) -> tuple[str, ...]:
    """Non-empty, non-comment (``#``) lines of a text file from ``pipeline/envs/data``."""
    lines = (DATA_DIR / name).read_text(encoding="utf-8").splitlines()
    return tuple(s for s in (line.strip() for line in lines) if s and not s.startswith("#"))


class Prompts:
    """The prompt templates of one game, read from the ``"prompts"`` object of its data file."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.templates: dict[str, str] = data["prompts"]

    def __call__(self, key: str, **fields: Any) -> str:
        return self.templates[key].format(**fields)


def seeded(*parts: object) -> random.Random:
    """A generator seeded by a readable key: string seeds hash the same on every run and platform."""
    return random.Random(":".join(str(p) for p in parts))


def shown_candidates(secret: str, pool: list[str] | tuple[str, ...], n: int, key: str) -> list[str]:
    """A difficulty tier's candidate list: ``secret`` and ``n - 1`` others of ``pool``, in an order that does not
    give the secret away; a pure function of (``key``, ``secret``, ``n``), so every run shows the same list."""
    rng = seeded(key, n, secret)
    others = rng.sample(sorted(set(pool) - {secret}), n - 1)
    shown = [*others, secret]
    rng.shuffle(shown)
    return shown


def check_shown_tier(game: str, tier: dict[str, Any], most: int) -> dict[str, Any]:
    """A shown-candidates tier (``candidates``: list length, ``max_turns``: turn limit) checked: the turn limit must
    stay below the number of candidates, so naming them one by one cannot win."""
    unknown = set(tier) - {"candidates", "max_turns"}
    if unknown:
        raise ValueError(f"{game} tier: unknown key(s) {sorted(unknown)} (candidates, max_turns)")
    n, turns = tier.get("candidates"), tier.get("max_turns")
    if not isinstance(n, int) or not 2 <= n <= most:
        raise ValueError(f"{game} tier: candidates must be an integer in 2..{most}, got {n!r}")
    if not isinstance(turns, int) or not 1 <= turns < n:
        raise ValueError(f"{game} tier: max_turns must be an integer in 1..{n - 1} (below candidates={n}, so "
                         f"listing every candidate cannot win), got {turns!r}")
    return {"candidates": n, "max_turns": turns}


def task_id(group: str, split: Split, index: int) -> str:
    return f"{group}-{split}-{index:04d}"


def per_difficulty(total: int) -> dict[str, int]:
    """``total`` tasks shared as evenly as possible over easy / medium / hard (easy gets the remainder)."""
    base, extra = divmod(total, len(DIFFICULTIES))
    return {level: base + (i < extra) for i, level in enumerate(DIFFICULTIES)}


class ShownCandidates:
    """The shown-candidates tiers of a guessing game (``GAME@shownN``): the opening lists the game's ``shown(task)``
    candidates, the secret among them, and asks which one it is; the game ends after the tier's ``max_turns``.
    Mixed in before the game's base class; the game gives ``SYSTEM_SHOWN``, ``FIRST_SHOWN`` and ``shown``."""

    SYSTEM_SHOWN: str
    FIRST_SHOWN: str

    def set_tier(self, spec: str) -> None:
        super().set_tier(spec)  # type: ignore[misc]
        self.max_turns = self.tier["max_turns"]

    def system_prompt(self, task: Any) -> str:
        return self.SYSTEM_SHOWN if self.tier else super().system_prompt(task)  # type: ignore[misc]

    def first_message(self, task: Any) -> str:
        if not self.tier:
            return super().first_message(task)  # type: ignore[misc]
        shown = self.shown(task)
        return self.FIRST_SHOWN.format(**self.prompt_fields(task), n=len(shown), candidates=", ".join(shown))


@dataclass
class Episode:
    """What every game state tracks; games subclass it with their own fields."""

    task: Task
    turns: int = 0
    done: bool = False
    success: bool = False


class TextGame(Game):
    """A game whose prompts live in its data file and whose ``step`` counts turns.

    Subclasses implement ``make_tasks`` and ``play``; ``step`` ends the episode on success, on a losing
    move, or when ``max_turns`` moves have been made (invalid moves count as turns too).
    """

    data_file: str = ""

    def __init__(self, environment: Any = None) -> None:
        super().__init__(environment)
        self.config: dict[str, Any] = load_json(self.data_file or f"{self.name}.json")  # the game's data file
        self.prompts = Prompts(self.config)
        self._tasks: dict[str, list[Task]] = {}

    @abstractmethod
    def make_tasks(self, split: Split) -> list[Task]:
        """Build the tasks of a split (called once per split and cached)."""

    @abstractmethod
    def play(self, state: Any, action: str) -> StepResult:
        """Apply one move; ``state.turns`` already counts it. Set ``done`` only for an early end."""

    def tasks(self, split: Split) -> list[Task]:
        if split not in ("train", "eval"):
            raise ValueError(f"unknown split {split!r} (train or eval)")
        if split not in self._tasks:
            tasks = self.make_tasks(split)
            if split == "eval" and not self.held_out_fresh_draws:  # a held-out task is never a train task
                seen = {json.dumps(t.env, sort_keys=True) for t in self.tasks("train")}
                tasks = [t for t in tasks if json.dumps(t.env, sort_keys=True) not in seen]
            self._tasks[split] = tasks
        return list(self._tasks[split])

    def prompt_fields(self, task: Task) -> dict[str, Any]:
        """Fields available to the ``system`` and ``first`` templates."""
        return {"max_turns": self.max_turns, "target": task.agent}

    def system_prompt(self, task: Task) -> str:
        return self.prompts("system", **self.prompt_fields(task))

    def first_message(self, task: Task) -> str:
        return self.prompts("first", **self.prompt_fields(task))

    def step(self, state: Episode, action: str) -> StepResult:
        if state.done:
            return self.game_over(state)
        state.turns += 1
        return self.finish_turn(state, self.play(state, action.strip()))

    def game_over(self, state: Episode) -> StepResult:
        """The reply to a move made after the episode ended (it changes nothing)."""
        return StepResult(self.prompts("over"), done=True, success=state.success)

    def finish_turn(self, state: Episode, result: StepResult) -> StepResult:
        """End the episode on success, on an early end, or when the turn budget is spent."""
        result.done = result.done or result.success or state.turns >= self.max_turns
        state.done, state.success = result.done, result.success
        result.info.setdefault("turn", state.turns)
        return result


# -- grids (battleship, minesweeper): rows are letters, columns are numbers from 1 ---------------------------
ROW_LETTERS = "ABCDEFGHIJ"
_CELL_RE = re.compile(r"\b([A-Ja-j])\s*-?\s*(\d{1,2})\b")


def cell_name(row: int, col: int) -> str:
    return f"{ROW_LETTERS[row]}{col + 1}"


def parse_cell(text: str, size: int) -> tuple[int, int] | None:
    """The first coordinate like ``B3`` in ``text`` if it lies on a ``size`` x ``size`` board."""
    match = _CELL_RE.search(text)
    if match is None:
        return None
    row, col = ROW_LETTERS.index(match.group(1).upper()), int(match.group(2)) - 1
    return (row, col) if 0 <= row < size and 0 <= col < size else None


def neighbours(row: int, col: int, size: int) -> list[tuple[int, int]]:
    return [
        (r, c)
        for r in range(row - 1, row + 2)
        for c in range(col - 1, col + 2)
        if (r, c) != (row, col) and 0 <= r < size and 0 <= c < size
    ]
