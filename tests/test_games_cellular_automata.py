import random

import pytest

from pipeline.envs.base import Task, make_game
from pipeline.envs.cellular_automata import apply_rule, known_outputs, parse_rule, rule_bits


@pytest.mark.parametrize(
    ("rule", "row", "expected"),
    [
        # Rule 30 = 00011110: 100, 011, 010, 001 -> 1. A lone 1 at index 3 sees 001 (index 2), 010 (3), 100 (4).
        (30, "00010000", "00111000"),
        # Rule 90 = left XOR right: index 2 and index 4 have exactly one live neighbour.
        (90, "00010000", "00101000"),
        # Rule 110 = 01101110: 001 -> 1, 010 -> 1, 100 -> 0.
        (110, "00010000", "00110000"),
        # Rows wrap: index 0 sees (index 7, 0, 1) = 1,1,0 and index 7 sees (6, 7, 0) = 0,1,1.
        (90, "10000001", "11000011"),
        (30, "10000001", "01000011"),
    ],
)
def test_elementary_rules_on_a_small_row(rule, row, expected):
    assert apply_rule(rule, row) == expected


def test_rule_formats():
    assert rule_bits(30) == "00011110" and rule_bits(110) == "01101110"
    assert parse_rule("30") == parse_rule("00011110") == parse_rule("Rule 30") == 30
    assert parse_rule("0001 1110") == 30
    assert parse_rule("256") is None and parse_rule("thirty") is None
    assert known_outputs([("00010000", "00111000")]) == {"000": "0", "001": "1", "010": "1", "100": "1"}


def test_wrong_guess_gets_a_discriminating_example():
    game = make_game("cellular_automata")
    task = Task("cellular_automata", "t", {"rule": 30, "rows": ["00010000"]}, "00010000 -> 00111000")
    state = game.reset(task, random.Random(0))
    wrong = game.step(state, "90")
    row, nxt = wrong.reply.removeprefix("No. Another example: ").split(" -> ")
    assert nxt == apply_rule(30, row) != apply_rule(90, row)
    assert game.step(state, "banana").info["invalid"]
    right = game.step(state, "00011110")
    assert right.success and state.turns == 3


def test_held_out_rules_are_unseen_in_training():
    game = make_game("cellular_automata")
    train_rules = {t.env["rule"] for t in game.tasks("train")}
    assert train_rules.isdisjoint(t.env["rule"] for t in game.tasks("eval"))
