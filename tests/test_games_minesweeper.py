import random

from pipeline.envs.base import Task, make_game
from pipeline.envs.minesweeper import deduce, flood_reveal, latest_board

# 5x5 field, mines at A3 and C1:
#       1 2 3 4 5
#   A   0 1 * 1 0
#   B   1 2 1 1 0
#   C   * 1 0 0 0
#   D   1 1 0 0 0
#   E   0 0 0 0 0
# Opening E5 floods the zeros around the bottom and right edges and shows their bordering numbers; A1 is a
# zero too, but walled off by the 1s at A2 / B1 and the 2 at B2, so it stays hidden with A2 and B1.
TASK = Task("minesweeper", "t", {"size": 5, "mines": ["A3", "C1"]}, "2 mines")
AFTER_E5 = "E5: safe\n  12345\nA ???1.\nB ?211.\nC ?1...\nD 11...\nE ....."


def test_flood_fill_opens_zeros_and_their_borders_only():
    game = make_game("minesweeper")
    state = game.reset(TASK, random.Random(0))
    result = game.step(state, "E5")
    assert result.reply == AFTER_E5 and not result.done
    hidden = {(r, c) for r in range(5) for c in range(5)} - state.revealed
    assert hidden == {(0, 0), (0, 1), (1, 0), (0, 2), (2, 0)}
    # A1 is a zero: it opens A2 and B1, the last safe cells.
    win = game.step(state, "A1")
    assert win.success and win.done and "Goal reached" in win.reply


def test_flood_fill_on_its_own():
    mines = {(0, 2), (2, 0)}
    assert flood_reveal(5, mines, set(), (0, 0)) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert flood_reveal(5, mines, set(), (1, 1)) == {(1, 1)}  # a number opens only itself


def test_a_mine_loses_and_the_first_move_is_always_safe():
    game = make_game("minesweeper")
    state = game.reset(TASK, random.Random(0))
    game.step(state, "E5")
    boom = game.step(state, "A3")
    assert boom.done and not boom.success and "mine" in boom.reply

    fresh = game.reset(TASK, random.Random(0))
    first = game.step(fresh, "A3")  # a mine, but the first reveal: the mine moves to A1
    assert not first.done and (0, 0) in fresh.mines and (0, 2) not in fresh.mines


def test_scripted_deductions_from_a_shown_board():
    board = latest_board([("E5", AFTER_E5)])
    safe, mines = deduce(5, board)
    # D1=1 has one hidden neighbour, C1, and A4=1 one, A3: both mines. B2=2 is then full: A1, A2, B1 are safe.
    assert (2, 0) in mines and (0, 2) in mines
    assert {(0, 0), (0, 1), (1, 0)} <= safe
