"""Cellular automata: infer a hidden elementary (Wolfram) rule from example transitions; 6 tries.

Rows wrap around. A rule is its number 0-255: bit ``4l + 2c + r`` is the next value of a cell whose
(left, centre, right) are (l, c, r). Difficulty is how many of the 8 neighbourhoods the opening examples
leave unseen (0-1 easy, 2-3 medium, 4-5 hard), so an agent that stays consistent with the evidence always
finishes in time: every wrong answer is answered with a new example on which the guess and the rule differ.
Held-out tasks use rules never seen in training.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from pipeline.envs.base import Split, StepResult, Task, register
from pipeline.envs.gamekit import DIFFICULTIES, Episode, TextGame, per_difficulty, seeded, task_id

NEIGHBOURHOODS = ("111", "110", "101", "100", "011", "010", "001", "000")
_EXAMPLE_RE = re.compile(r"\b([01]{4,}) -> ([01]{4,})\b")


def rule_bits(rule: int) -> str:
    """The 8 outputs of ``rule`` for 111 110 101 100 011 010 001 000 (rule 30 -> 00011110)."""
    return format(rule, "08b")


def apply_rule(rule: int, row: str) -> str:
    """One step of elementary rule ``rule`` on a wrapping row of 0/1 characters."""
    n = len(row)
    return "".join(str(rule >> int(row[i - 1] + row[i] + row[(i + 1) % n], 2) & 1) for i in range(n))


def parse_rule(action: str) -> int | None:
    """A rule from 8 bits (``00011110``) or a number 0-255 (``30``, ``rule 30``); None otherwise."""
    text = action.strip().lower().removeprefix("rule").strip()
    bits = re.sub(r"[\s,]", "", text)
    if len(bits) == 8 and set(bits) <= {"0", "1"}:
        return int(bits, 2)
    if text.isdigit() and len(text) <= 3 and int(text) <= 255:
        return int(text)
    return None


def seen_neighbourhoods(rows: list[str]) -> set[str]:
    n = len(rows[0]) if rows else 0
    return {row[i - 1] + row[i] + row[(i + 1) % n] for row in rows for i in range(n)}


def known_outputs(examples: list[tuple[str, str]]) -> dict[str, str]:
    """Neighbourhood -> next value, as far as the examples show."""
    known = {}
    for row, nxt in examples:
        n = len(row)
        for i in range(n):
            known[row[i - 1] + row[i] + row[(i + 1) % n]] = nxt[i]
    return known


@dataclass
class AutomatonState(Episode):
    pass


@register
class CellularAutomata(TextGame):
    name = "cellular_automata"
    max_turns = 6

    def _rules(self, split: Split) -> list[int]:
        rules = list(range(256))
        seeded(self.name, "rules").shuffle(rules)
        n_eval = self.config["eval_rules"]
        return rules[:n_eval] if split == "eval" else rules[n_eval:]

    def make_tasks(self, split: Split) -> list[Task]:
        rng = seeded(self.name, split)
        width, rules = self.config["width"], self._rules(split)
        wanted = per_difficulty(self.config["tasks"][split])
        level_of = {u: level for level in DIFFICULTIES for u in self.config["unknown_patterns"][level]}
        found: dict[str, list[tuple[int, list[str]]]] = {level: [] for level in DIFFICULTIES}
        while any(len(found[level]) < wanted[level] for level in DIFFICULTIES):
            # Sparse or dense rows show few neighbourhoods; mixed rows show most.
            density = rng.uniform(0.05, 0.95)
            rows = ["".join("1" if rng.random() < density else "0" for _ in range(width))
                    for _ in range(rng.randint(1, 3))]
            level = level_of.get(8 - len(seen_neighbourhoods(rows)))
            if level is not None and len(found[level]) < wanted[level]:
                found[level].append((rng.choice(rules), rows))
        tasks = [(rule, rows, level) for level in DIFFICULTIES for rule, rows in found[level]]
        rng.shuffle(tasks)
        return [
            Task(self.name, task_id(self.name, split, i), {"rule": rule, "rows": rows},
                 self.render_examples(rule, rows), level, split)
            for i, (rule, rows, level) in enumerate(tasks)
        ]

    def render_examples(self, rule: int, rows: list[str]) -> str:
        return "\n".join(self.prompts("example", row=row, next=apply_rule(rule, row)) for row in rows)

    def reset(self, task: Task, rng: random.Random) -> AutomatonState:
        return AutomatonState(task=task)

    def play(self, state: AutomatonState, action: str) -> StepResult:
        guess = parse_rule(action)
        rule = state.task.env["rule"]
        if guess is None:
            return StepResult(self.prompts("invalid"), done=False, info={"invalid": True})
        if guess == rule:
            return StepResult(self.prompts("solved", rule=rule), done=True, success=True)
        row = self.counterexample(state.task, guess)
        return StepResult(self.prompts("wrong", example=self.render_examples(rule, [row])), done=False)

    def counterexample(self, task: Task, guess: int) -> str:
        """A row on which ``guess`` and the hidden rule disagree, fixed by (task, guess)."""
        rule, width = task.env["rule"], self.config["width"]
        rng = seeded(self.name, task.task_id, guess)
        while True:
            row = "".join(rng.choice("01") for _ in range(width))
            if apply_rule(rule, row) != apply_rule(guess, row):
                return row

    def is_correct_guess(self, task: Task, action: str) -> bool:
        return parse_rule(action) == task.env["rule"]

    # -- scripted player: read every example shown, fill the unseen neighbourhoods at random --------------
    def scripted_action(self, task: Task, history: list[tuple[str, str]], rng: random.Random, noise: float) -> str:
        if rng.random() < noise:
            return rule_bits(rng.randrange(256))
        shown = _EXAMPLE_RE.findall(task.agent) + [ex for _, reply in history for ex in _EXAMPLE_RE.findall(reply)]
        known = known_outputs(shown)
        tried = {parse_rule(a) for a, _ in history}
        for _ in range(100):
            bits = "".join(known.get(p) or rng.choice("01") for p in NEIGHBOURHOODS)
            if int(bits, 2) not in tried:
                return bits
        return bits
