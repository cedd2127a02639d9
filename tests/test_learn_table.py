"""`curio table`'s lower bound (pipeline/tools/table.py) on the mean turns on wins of any policy at a given success,
checked on numbers worked by hand and against every deterministic policy of a small game, enumerated."""

import itertools

import pytest

from pipeline.tools.table import fewest_turns_on_wins, shown_tier


def test_worked_by_hand():
    # 4 candidates, 3 turns: at most 1/4 won by turn 1, 1/2 by turn 2, all by turn 3
    assert fewest_turns_on_wins(0.25, 4, 3) == pytest.approx(1.0)
    assert fewest_turns_on_wins(0.5, 4, 3) == pytest.approx((0.25 * 1 + 0.25 * 2) / 0.5)  # 1.5
    assert fewest_turns_on_wins(0.57, 4, 3) == pytest.approx((0.25 + 0.5 + 3 * 0.07) / 0.57)  # 1.684
    assert fewest_turns_on_wins(0.75, 4, 3) == pytest.approx((0.25 + 0.5 + 0.75) / 0.75)  # 2.0
    # 10 candidates, 5 turns: 0.1, 0.2, 0.4, 0.8, 1.0 by turns 1..5
    assert fewest_turns_on_wins(0.5, 10, 5) == pytest.approx((0.1 + 2 * 0.1 + 3 * 0.2 + 4 * 0.1) / 0.5)
    with pytest.raises(ValueError):
        fewest_turns_on_wins(0.8, 4, 2)  # two turns reach at most half of 4 candidates
    with pytest.raises(ValueError):
        fewest_turns_on_wins(0.0, 4, 3)


def _policies(candidates: tuple[int, ...], turns: int):
    """Every deterministic policy on ``candidates`` (the secrets still possible), as {secret: turn won or None}. A
    turn guesses one candidate (a wrong guess rules it out), asks a yes/no question (splits the candidates in two;
    either reply is one bit) or wastes the turn (names no candidate, repeats itself)."""
    if turns == 0 or not candidates:
        yield dict.fromkeys(candidates)
        return
    for guess in candidates:
        rest = tuple(c for c in candidates if c != guess)
        for sub in _policies(rest, turns - 1):
            yield {guess: 1, **{c: None if t is None else t + 1 for c, t in sub.items()}}
    for sub in _policies(candidates, turns - 1):
        yield {c: None if t is None else t + 1 for c, t in sub.items()}
    for size in range(1, len(candidates)):
        for yes in itertools.combinations(candidates, size):
            no = tuple(c for c in candidates if c not in yes)
            for a, b in itertools.product(list(_policies(yes, turns - 1)), list(_policies(no, turns - 1))):
                yield {c: None if t is None else t + 1 for c, t in {**a, **b}.items()}


def test_no_policy_of_a_small_game_beats_the_bound():
    n, turns = 4, 3
    fewest: dict[float, float] = {}  # success -> the fewest mean turns on wins of the policies reaching it
    for policy in _policies(tuple(range(n)), turns):
        won = [t for t in policy.values() if t is not None]
        if won:
            success, mean = len(won) / n, sum(won) / len(won)
            assert mean >= fewest_turns_on_wins(success, n, turns) - 1e-9, policy
            fewest[success] = min(fewest.get(success, mean), mean)
    assert sorted(fewest) == [0.25, 0.5, 0.75, 1.0]  # questions first can win every game
    # up to 3/4 the bound is reached (name a new candidate each turn, waste the second or third); at 1.0 it is not
    for success in (0.25, 0.5, 0.75):
        assert fewest[success] == pytest.approx(fewest_turns_on_wins(success, n, turns))
    assert fewest[1.0] == pytest.approx(2.5)
    assert fewest_turns_on_wins(1.0, n, turns) == pytest.approx(2.25)


def test_shown_tiers_are_read_from_the_group_name():
    assert shown_tier("twenty_questions@shown4") == {"candidates": 4, "max_turns": 3}
    assert shown_tier("guess_my_city@shown10") == {"candidates": 10, "max_turns": 5}
    assert shown_tier("bandit@easy3") is None
    assert shown_tier("twenty_questions") is None
