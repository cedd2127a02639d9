import random

from pipeline.envs.base import Task, make_game


def test_hits_misses_and_sunk_ships():
    game = make_game("battleship")
    ships = [["A1", "A2"], ["C1", "C2", "C3"], ["C5", "D5", "E5"]]
    task = Task("battleship", "t", {"size": 5, "ships": ships}, "3 ships of lengths 2, 3 and 3")
    state = game.reset(task, random.Random(0))
    assert game.step(state, "A1").reply == "A1: hit"
    assert game.step(state, "a2").reply == "A2: hit and sunk (A1 A2). 2 ships left."
    assert game.step(state, "B1").reply == "B1: miss"
    repeat = game.step(state, "A1")
    assert repeat.info["invalid"] and "already" in repeat.reply
    assert game.step(state, "F1").info["invalid"]  # off a 5x5 board
    game.step(state, "C1")
    game.step(state, "C2")
    assert game.step(state, "C3").reply == "C3: hit and sunk (C1 C2 C3). 1 ship left."
    game.step(state, "E5")
    assert game.step(state, "D5").reply == "D5: hit"
    last = game.step(state, "C5")
    assert last.success and last.done and last.reply.endswith("All ships sunk. Goal reached!")
    assert state.turns == 11


def test_ships_do_not_overlap_and_fit_the_board():
    game = make_game("battleship")
    for task in game.tasks("train")[:200]:
        cells = [c for ship in task.env["ships"] for c in ship]
        assert len(cells) == len(set(cells))
        size = task.env["size"]
        assert all(c[0] in "ABCDEF"[:size] and 1 <= int(c[1:]) <= size for c in cells)
