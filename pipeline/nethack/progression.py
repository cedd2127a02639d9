"""BALROG's NetHack progression (Paglieri et al. 2024): how far an episode got, 0-100, read off human play.

For each dungeon level and each experience level, BALROG's table (``data/balrog_progression.json``, from the
NLD-NAO dataset of human games) holds the share of the human games that reached it and went on to ascend. An
episode's progression is the largest of those shares over the dungeon levels and experience levels it reached, in
percent. Both columns rise with the level, so it is ``100 × max(P(dungeon level), P(experience level))`` at the
deepest level and the highest experience level reached. Reaching dungeon level 1 at experience level 1 is 0.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

TABLE = Path(__file__).with_name("data") / "balrog_progression.json"


@cache
def _table() -> tuple[list[float], list[float]]:
    data = json.loads(TABLE.read_text())
    return data["dungeon_level"], data["experience_level"]


def progression(depth: int, experience_level: int) -> float:
    """BALROG's progression of an episode that reached dungeon level ``depth`` and ``experience_level``, 0-100
    (levels past the table's last count as its last)."""
    dungeon, experience = _table()
    d = dungeon[min(max(depth, 1), len(dungeon)) - 1]
    x = experience[min(max(experience_level, 1), len(experience)) - 1]
    return 100.0 * max(d, x)
