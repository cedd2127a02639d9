import json
import math
import random

import pytest

from pipeline.envs.base import make_game
from pipeline.text.curriculum import UCBCurriculum, learning_potential, turns_with_failures

TASKS = {"e1": "easy", "e2": "easy", "m1": "medium", "m2": "medium", "h1": "hard", "h2": "hard"}


def test_learning_potential_is_the_unbiased_coefficient_of_variation():
    # turns 2, 4, 6: mean 4, sample std sqrt((4 + 0 + 4) / 2) = 2, CoV 0.5, times (1 + 1/12) = 13/24.
    assert learning_potential([2, 4, 6]) == pytest.approx(13 / 24)
    # turns 1, 3: mean 2, std sqrt(2), CoV 0.70711, times (1 + 1/8) = 0.79550.
    assert learning_potential([1, 3]) == pytest.approx(1.125 * math.sqrt(2) / 2)
    assert learning_potential([5, 5, 5, 5]) == 0.0  # always the same: nothing to learn
    assert learning_potential([7]) == 0.0  # one sample has no spread
    # Failures count as max turns: two wins in 3 and one loss in a 20-turn game.
    turns = turns_with_failures([3, 9, 3], [True, False, True], max_turns=20)
    assert turns == [3, 20, 3]
    mean, std = 26 / 3, math.sqrt(((3 - 26 / 3) ** 2 * 2 + (20 - 26 / 3) ** 2) / 2)
    assert learning_potential(turns) == pytest.approx((1 + 1 / 12) * std / mean)


def test_unplayed_arms_first_then_ucb():
    curriculum = UCBCurriculum(TASKS, alpha=1.0)
    first = curriculum.select(random.Random(0), 3)
    assert sorted(TASKS[t] for t in first) == ["easy", "hard", "medium"]
    curriculum.update(next(t for t in first if TASKS[t] == "easy"), [2, 2, 2, 2])  # potential 0
    curriculum.update(next(t for t in first if TASKS[t] == "medium"), [2, 4, 6])  # 13/24
    curriculum.update(next(t for t in first if TASKS[t] == "hard"), [1, 3])  # 0.79550
    # N = 3, one pull each: score = potential + sqrt(2 ln 3) = potential + 1.48230; hard wins.
    bonus = math.sqrt(2 * math.log(3))
    assert curriculum.arm_scores() == pytest.approx(
        {"easy": bonus, "medium": 13 / 24 + bonus, "hard": 1.125 * math.sqrt(2) / 2 + bonus})
    assert TASKS[curriculum.select(random.Random(0), 1)[0]] == "hard"
    # N = 4: easy 0 + sqrt(2 ln 4) = 1.66511, medium 0.54167 + 1.66511 = 2.20678,
    # hard 0.79550 + sqrt(2 ln 4 / 2) = 0.79550 + 1.17741 = 1.97291 -> medium.
    assert TASKS[curriculum.select(random.Random(0), 1)[0]] == "medium"


def test_a_batch_spreads_over_arms_and_tasks_within_an_arm_are_uniform():
    curriculum = UCBCurriculum(TASKS, alpha=1.0)
    batch = curriculum.select(random.Random(0), 6)
    assert sorted(TASKS[t] for t in batch) == ["easy", "easy", "hard", "hard", "medium", "medium"]
    assert len(set(batch)) == 6  # no repeat while the arm has unused tasks

    greedy = UCBCurriculum(TASKS, alpha=0.0)
    greedy.select(random.Random(0), 3)
    greedy.update("m1", [1, 9])
    picks = greedy.select(random.Random(0), 400)
    assert {TASKS[t] for t in picks} == {"medium"}  # no exploration bonus: exploit the best arm
    assert 150 < picks.count("m1") < 250


def test_state_round_trip_resumes_identically():
    tasks = make_game("cellular_automata").tasks("train")
    one = UCBCurriculum(tasks, alpha=0.5)
    rng = random.Random(3)
    for _ in range(4):
        for task_id in one.select(rng, 5):
            one.update(task_id, [rng.randint(1, 6) for _ in range(4)])
    saved = json.loads(json.dumps(one.state_dict()))
    two = UCBCurriculum(tasks)
    two.load_state_dict(saved)
    assert two.select(random.Random(9), 20) == one.select(random.Random(9), 20)
    with pytest.raises(ValueError, match="arms"):
        UCBCurriculum(TASKS).load_state_dict(saved)
    with pytest.raises(KeyError):
        one.update("not-a-task", [1, 2])
