import random

import pytest

from pipeline.envs.base import Task, make_game
from pipeline.envs.mastermind import difficulty, pegs


@pytest.mark.parametrize(
    ("code", "guess", "black", "white"),
    [
        ("1122", "2211", 0, 4),  # nothing in place; two 1s and two 2s shared
        ("1234", "1111", 1, 0),  # the code has one 1: it is black, the other three 1s count for nothing
        ("1123", "3111", 1, 2),  # 1 in place at 2; shared: two 1s + one 3 = 3, minus the black = 2 white
        ("1212", "1122", 2, 2),  # places 1 and 4 agree; all four digits shared
        ("1234", "4321", 0, 4),
        ("0000", "0000", 4, 0),
        ("5678", "1234", 0, 0),
        ("1000", "0111", 0, 2),  # one 1 and one 0 shared, none in place
    ],
)
def test_pegs_never_double_count_duplicates(code, guess, black, white):
    assert pegs(code, guess) == (black, white)


def test_game_replies_and_ends_on_the_code():
    game = make_game("mastermind")
    state = game.reset(Task("mastermind", "t", "1123", "secret 4-digit code"), random.Random(0))
    assert game.step(state, "3111").reply == "3111: 1 black, 2 white"
    bad = game.step(state, "12a4")
    assert bad.info["invalid"] and state.turns == 2
    assert game.step(state, "1 1 2 3").success


def test_tasks_are_balanced_and_disjoint():
    game = make_game("mastermind")
    train, held_out = game.tasks("train"), game.tasks("eval")
    assert (len(train), len(held_out)) == (1000, 500)
    assert {t.env for t in train}.isdisjoint(t.env for t in held_out)
    assert all(t.difficulty == difficulty(t.env) for t in train)
    assert difficulty("1234") == "easy" and difficulty("1123") == "medium" and difficulty("1122") == "hard"
