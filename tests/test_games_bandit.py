import random

from pipeline.envs.base import Task, make_game

TASK = Task("bandit", "t", {"means": [0.2, 0.9, 0.4]}, "A, B, C")


def _pull_all(game, state, arm="B"):
    return [game.step(state, arm) for _ in range(game.budget)]


def test_twenty_pulls_then_naming_the_best_arm_succeeds():
    game = make_game("bandit")
    assert not game.score_by_turns and game.max_turns == 21
    state = game.reset(TASK, random.Random(0))
    pulls = _pull_all(game, state)
    assert not any(p.done for p in pulls)
    assert all(p.reply.startswith("B: ") for p in pulls) and "No pulls left" in pulls[-1].reply
    assert sum(p.reward for p in pulls) == state.total_reward > 10  # B pays 90% of the time
    answer = game.step(state, "B")
    assert answer.success and answer.done and "Goal reached" in answer.reply


def test_naming_another_arm_fails_and_bad_pulls_cost_the_budget():
    game = make_game("bandit")
    state = game.reset(TASK, random.Random(0))
    bad = game.step(state, "Z")
    assert bad.info["invalid"] and bad.reward == 0.0 and state.pulls == 1
    for _ in range(game.budget - 1):
        game.step(state, "A")
    answer = game.step(state, "C")
    assert answer.done and not answer.success
    assert game.is_correct_guess(TASK, "arm B") and not game.is_correct_guess(TASK, "A")


def test_rewards_follow_the_episode_generator():
    game = make_game("bandit")
    one, two = game.reset(TASK, random.Random(7)), game.reset(TASK, random.Random(7))
    assert [r.reward for r in _pull_all(game, one, "C")] == [r.reward for r in _pull_all(game, two, "C")]
