"""Minesweeper on a 5x5 or 6x6 field: reveal cells (zeros open their neighbours), lose on a mine, win when
every safe cell is revealed; 20 moves.

The first reveal is always safe: a mine under it moves to the first free cell in reading order (a fixed
rule, so an episode is still a function of its task and its moves). Every safe reply shows the whole board,
so the latest reply alone says where the game stands.
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
    neighbours,
    parse_cell,
    per_difficulty,
    seeded,
    task_id,
)

Cell = tuple[int, int]
_BOARD_ROW_RE = re.compile(r"^([A-J]) ([.?1-8]+)$", re.MULTILINE)


def mine_counts(size: int, mines: set[Cell]) -> dict[Cell, int]:
    return {(r, c): sum(n in mines for n in neighbours(r, c, size)) for r in range(size) for c in range(size)}


def flood_reveal(size: int, mines: set[Cell], revealed: set[Cell], start: Cell) -> set[Cell]:
    """Cells newly revealed by opening safe ``start``: zeros open all their neighbours, transitively."""
    counts = mine_counts(size, mines)
    opened: set[Cell] = set()
    stack = [start]
    while stack:
        cell = stack.pop()
        if cell in opened or cell in revealed or cell in mines:
            continue
        opened.add(cell)
        if counts[cell] == 0:
            stack.extend(neighbours(*cell, size))
    return opened


def render_board(size: int, mines: set[Cell], revealed: set[Cell]) -> str:
    """Column header, then one line per row: ``?`` hidden, ``.`` zero, else the count of adjacent mines."""
    counts = mine_counts(size, mines)
    lines = ["  " + "".join(str(c + 1) for c in range(size))]
    for r in range(size):
        marks = "".join(
            "?" if (r, c) not in revealed else "." if counts[(r, c)] == 0 else str(counts[(r, c)])
            for c in range(size)
        )
        lines.append(f"{ROW_LETTERS[r]} {marks}")
    return "\n".join(lines)


@dataclass
class MinesweeperState(Episode):
    mines: set[Cell] = field(default_factory=set)
    revealed: set[Cell] = field(default_factory=set)


@register
class Minesweeper(TextGame):
    name = "minesweeper"
    max_turns = 20

    def make_tasks(self, split: Split) -> list[Task]:
        rng = seeded(self.name, split)
        tasks = []
        for level in DIFFICULTIES:
            size, n_mines = self.config["levels"][level]["size"], self.config["levels"][level]["mines"]
            cells = [cell_name(r, c) for r in range(size) for c in range(size)]
            for _ in range(per_difficulty(self.config["tasks"][split])[level]):
                env = {"size": size, "mines": sorted(rng.sample(cells, n_mines))}
                tasks.append((env, f"{n_mines} mines", level))
        rng.shuffle(tasks)
        return [Task(self.name, task_id(self.name, split, i), env, agent, level, split)
                for i, (env, agent, level) in enumerate(tasks)]

    def prompt_fields(self, task: Task) -> dict:
        size = task.env["size"]
        return {**super().prompt_fields(task), "size": size, "last_row": ROW_LETTERS[size - 1],
                "mines": len(task.env["mines"])}

    def reset(self, task: Task, rng: random.Random) -> MinesweeperState:
        size = task.env["size"]
        mines = {cell for cell in (parse_cell(name, size) for name in task.env["mines"]) if cell}
        if len(mines) != len(task.env["mines"]):
            raise ValueError(f"task {task.task_id}: mines {task.env['mines']} do not fit a {size}x{size} field")
        return MinesweeperState(task=task, mines=mines)

    def play(self, state: MinesweeperState, action: str) -> StepResult:
        fields = self.prompt_fields(state.task)
        size = fields["size"]
        cell = parse_cell(action, size)
        if cell is None:
            return StepResult(self.prompts("invalid", **fields), done=False, info={"invalid": True})
        name = cell_name(*cell)
        if cell in state.revealed:
            board = render_board(size, state.mines, state.revealed)
            return StepResult(self.prompts("repeat", cell=name, board=board), done=False, info={"invalid": True})
        if cell in state.mines and not state.revealed:
            # First reveal: move the mine away, to the first free cell in reading order.
            free = next((r, c) for r in range(size) for c in range(size) if (r, c) not in state.mines | {cell})
            state.mines = (state.mines - {cell}) | {free}
        if cell in state.mines:
            return StepResult(self.prompts("boom", cell=name), done=True, success=False)
        state.revealed |= flood_reveal(size, state.mines, state.revealed, cell)
        if len(state.revealed) == size * size - len(state.mines):
            return StepResult(self.prompts("won", cell=name), done=True, success=True)
        board = render_board(size, state.mines, state.revealed)
        return StepResult(self.prompts("safe", cell=name, board=board), done=False)

    # -- scripted player: single-cell and subset deductions, else the least risky guess ----------------------
    def scripted_action(self, task: Task, history: list[tuple[str, str]], rng: random.Random, noise: float) -> str:
        size, n_mines = task.env["size"], len(task.env["mines"])
        board = latest_board(history)
        hidden = [(r, c) for r in range(size) for c in range(size) if board.get((r, c), "?") == "?"]
        if rng.random() < noise:
            return cell_name(*rng.choice(hidden))
        if not board:  # a corner is the likeliest cell to be a zero and open a region
            return cell_name(*rng.choice([(0, 0), (0, size - 1), (size - 1, 0), (size - 1, size - 1)]))
        safe, mines = deduce(size, board)
        if safe:
            return cell_name(*min(safe))
        risk = guess_risk(size, board, mines, n_mines)
        lowest = min(risk.values())
        return cell_name(*rng.choice([c for c, p in risk.items() if p == lowest]))


def latest_board(history: list[tuple[str, str]]) -> dict[Cell, str]:
    """The board shown in the most recent reply that has one: cell -> '?', '.' or a digit."""
    for _, reply in reversed(history):
        rows = _BOARD_ROW_RE.findall(reply)
        if rows:
            return {(ROW_LETTERS.index(letter), c): mark for letter, marks in rows for c, mark in enumerate(marks)}
    return {}


def deduce(size: int, board: dict[Cell, str]) -> tuple[set[Cell], set[Cell]]:
    """Hidden cells proven safe and proven mined by the numbers on the board."""
    mines: set[Cell] = set()
    safe: set[Cell] = set()
    changed = True
    while changed:
        changed = False
        constraints = []
        for cell, mark in board.items():
            if mark in "?.":
                continue
            unknown = {n for n in neighbours(*cell, size) if board[n] == "?" and n not in mines and n not in safe}
            need = int(mark) - sum(n in mines for n in neighbours(*cell, size))
            if unknown:
                constraints.append((frozenset(unknown), need))
        for unknown, need in constraints:
            changed |= _settle(unknown, need, safe, mines)
        if changed:
            continue
        # Subset rule: if A's cells all border B, B's other cells hold exactly need_B - need_A mines.
        for a, need_a in constraints:
            for b, need_b in constraints:
                if a < b:
                    changed |= _settle(b - a, need_b - need_a, safe, mines)
    return safe, mines


def _settle(cells: frozenset, need: int, safe: set, mines: set) -> bool:
    """Cells holding exactly ``need`` mines: all safe when 0, all mines when every one; True if decided."""
    if need == 0:
        safe |= cells
        return True
    if need == len(cells):
        mines |= cells
        return True
    return False


def guess_risk(size: int, board: dict[Cell, str], mines: set[Cell], n_mines: int) -> dict[Cell, float]:
    """A rough chance that each undecided hidden cell is a mine: the worst local ratio next to a number,
    the leftover density elsewhere."""
    hidden = {c for c, mark in board.items() if mark == "?" and c not in mines}
    density = max(0, n_mines - len(mines)) / max(1, len(hidden))
    risk = dict.fromkeys(hidden, density)
    touched: set[Cell] = set()
    for cell, mark in board.items():
        if mark in "?.":
            continue
        unknown = [n for n in neighbours(*cell, size) if n in hidden]
        if unknown:
            ratio = (int(mark) - sum(n in mines for n in neighbours(*cell, size))) / len(unknown)
            for n in unknown:
                risk[n] = max(risk[n], ratio) if n in touched else ratio
                touched.add(n)
    return risk
