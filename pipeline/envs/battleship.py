"""Battleship: three ships hidden on a 5x5 or 6x6 grid; hit / miss / sunk feedback; 20 shots.

A sunk ship's cells are named in the reply, so the agent knows exactly what is left to find. Firing at a
cell twice, or at something that is not a cell, wastes the shot.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from pipeline.envs.base import Split, StepResult, Task, register
from pipeline.envs.gamekit import (
    DIFFICULTIES,
    ROW_LETTERS,
    Episode,
    TextGame,
    cell_name,
    parse_cell,
    per_difficulty,
    seeded,
    task_id,
)

Cell = tuple[int, int]
_REPLY_RE = re.compile(r"^([A-J]\d{1,2}): (miss|hit)(?: and sunk \(([A-J0-9 ]+)\))?")
# A placement through unexplained hits is far likelier than one through unknown water.
_HIT_WEIGHT = 50.0


def ship_placements(size: int, length: int) -> list[tuple[Cell, ...]]:
    """Every horizontal and vertical position of a ship of ``length`` on a ``size`` x ``size`` grid."""
    spots = []
    for r in range(size):
        for c in range(size - length + 1):
            spots.append(tuple((r, c + i) for i in range(length)))
    for r in range(size - length + 1):
        for c in range(size):
            spots.append(tuple((r + i, c) for i in range(length)))
    return spots


def place_ships(size: int, lengths: list[int], rng: random.Random) -> list[list[str]]:
    """Random non-overlapping ships (they may touch), as lists of cell names."""
    while True:
        taken: set[Cell] = set()
        ships = []
        for length in lengths:
            free = [p for p in ship_placements(size, length) if not taken & set(p)]
            if not free:
                break
            ship = rng.choice(free)
            taken |= set(ship)
            ships.append([cell_name(r, c) for r, c in ship])
        else:
            return ships


@dataclass
class BattleshipState(Episode):
    fired: set[Cell] = field(default_factory=set)


@register
class Battleship(TextGame):
    name = "battleship"
    max_turns = 20

    def make_tasks(self, split: Split) -> list[Task]:
        rng = seeded(self.name, split)
        tasks = []
        for level in DIFFICULTIES:
            size, lengths = self.config["levels"][level]["size"], self.config["levels"][level]["ships"]
            described = f"3 ships of lengths {', '.join(map(str, lengths[:-1]))} and {lengths[-1]}"
            for _ in range(per_difficulty(self.config["tasks"][split])[level]):
                env = {"size": size, "ships": place_ships(size, lengths, rng)}
                tasks.append((env, described, level))
        rng.shuffle(tasks)
        return [Task(self.name, task_id(self.name, split, i), env, agent, level, split)
                for i, (env, agent, level) in enumerate(tasks)]

    def prompt_fields(self, task: Task) -> dict:
        size = task.env["size"]
        return {**super().prompt_fields(task), "size": size, "last_row": ROW_LETTERS[size - 1]}

    def reset(self, task: Task, rng: random.Random) -> BattleshipState:
        return BattleshipState(task=task)

    def play(self, state: BattleshipState, action: str) -> StepResult:
        fields = self.prompt_fields(state.task)
        cell = parse_cell(action, fields["size"])
        if cell is None:
            return StepResult(self.prompts("invalid", **fields), done=False, info={"invalid": True})
        name = cell_name(*cell)
        if cell in state.fired:
            return StepResult(self.prompts("repeat", cell=name), done=False, info={"invalid": True})
        state.fired.add(cell)
        ships = state.task.env["ships"]
        hit_ship = next((ship for ship in ships if name in ship), None)
        if hit_ship is None:
            return StepResult(self.prompts("miss", cell=name), done=False)
        fired_names = {cell_name(*c) for c in state.fired}
        if not set(hit_ship) <= fired_names:
            return StepResult(self.prompts("hit", cell=name), done=False)
        left = sum(not set(ship) <= fired_names for ship in ships)
        if left == 0:
            return StepResult(self.prompts("won", cell=name, ship=" ".join(hit_ship)), done=True, success=True)
        ships_left = "1 ship" if left == 1 else f"{left} ships"
        return StepResult(self.prompts("sunk", cell=name, ship=" ".join(hit_ship), left=ships_left), done=False)

    # -- scripted player: probability density over the placements still possible ---------------------------
    def scripted_action(self, task: Task, history: list[tuple[str, str]], rng: random.Random, noise: float) -> str:
        size = task.env["size"]
        remaining = [len(ship) for ship in task.env["ships"]]  # lengths are public: the prompt names them
        fired: set[Cell] = set()
        misses: set[Cell] = set()
        hits: set[Cell] = set()
        sunk: set[Cell] = set()
        for _, reply in history:
            match = _REPLY_RE.match(reply)
            if match is None:
                continue
            cell = parse_cell(match.group(1), size)
            if cell is None:
                continue
            fired.add(cell)
            (hits if match.group(2) == "hit" else misses).add(cell)
            if match.group(3):
                ship_cells = {c for c in (parse_cell(n, size) for n in match.group(3).split()) if c}
                sunk |= ship_cells
                remaining.remove(len(ship_cells))
        open_cells = [(r, c) for r in range(size) for c in range(size) if (r, c) not in fired]
        if rng.random() < noise:
            return cell_name(*rng.choice(open_cells))
        unexplained = hits - sunk
        weight = dict.fromkeys(open_cells, 0.0)
        for length in remaining:
            for spot in ship_placements(size, length):
                cells = set(spot)
                if cells & (misses | sunk):
                    continue
                w = _HIT_WEIGHT ** len(cells & unexplained)
                for c in cells - fired:
                    weight[c] += w
        best = max(weight.values())
        return cell_name(*rng.choice([c for c in open_cells if weight[c] == best]))
