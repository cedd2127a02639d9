import math

import pytest

from pipeline.text.multiturn_reward import (
    RewardWeights,
    entropy,
    information_gain,
    judge_score,
    multiturn_aware_reward,
    prefer_turn,
)


def test_reward_formula_on_hand_numbers():
    # mean(0.8, 0.5) = 0.65; + accuracy 0.4; - 5e-4 * 300 = 0.15  ->  0.9
    assert multiturn_aware_reward(accuracy=0.4, interactivity=0.8, information_gain=0.5, tokens=300) == (
        pytest.approx(0.9))
    # 3000 tokens would cost 1.5: the cost is capped at 1  ->  0.65 + 0.4 - 1 = 0.05
    assert multiturn_aware_reward(0.4, 0.8, 0.5, 3000) == pytest.approx(0.05)
    assert multiturn_aware_reward(1.0, 1.0, 1.0, 0) == pytest.approx(2.0)
    weights = RewardWeights(llm=2.0, task=0.5, cost=1e-3)  # 2 * 0.65 + 0.5 * 0.4 - 0.3 = 1.2
    assert multiturn_aware_reward(0.4, 0.8, 0.5, 300, weights) == pytest.approx(1.2)
    with pytest.raises(ValueError, match="accuracy"):
        multiturn_aware_reward(1.5, 0.5, 0.5, 10)


def test_known_bug_judge_scores_in_unit_range_are_not_rescaled_as_if_1_to_4():
    # The published code applied (x - 1) / 3 to scores already in [0, 1]: 0.25 became -0.25.
    for raw in (0.0, 0.25, 0.5, 0.9, 1.0):
        assert judge_score(raw) == raw >= 0.0
    worst = multiturn_aware_reward(judge_score(0.0), judge_score(0.0), judge_score(0.0), 0)
    assert worst == 0.0  # never negative before the token cost
    # A judge that really was asked for 1-4 is mapped onto [0, 1].
    assert [judge_score(x, scale=(1, 4)) for x in (1, 2.5, 4)] == [0.0, 0.5, 1.0]
    with pytest.raises(ValueError, match="outside"):
        judge_score(3.0)


def test_information_gain_is_the_normalised_entropy_drop():
    four = ["cat", "dog", "cow", "owl"]
    # 2 bits before, 1 bit after: 1 bit of 2 = 0.5
    assert information_gain(four, ["cat", "dog"]) == pytest.approx(0.5)
    assert information_gain(four, ["owl"]) == pytest.approx(1.0)
    assert information_gain(four, four) == 0.0
    assert information_gain(["cat"], ["cat"]) == 0.0  # nothing was uncertain
    assert information_gain(four, []) == 0.0  # contradictory answers carry no usable information
    # With a prior of 1/2, 1/4, 1/8, 1/8: H = 1.75 bits; keeping cow and owl leaves 1 bit: 0.75 / 1.75.
    prior = {"cat": 0.5, "dog": 0.25, "cow": 0.125, "owl": 0.125}
    assert entropy(four, prior) == pytest.approx(1.75)
    assert information_gain(four, ["cow", "owl"], prior) == pytest.approx(3 / 7)
    assert entropy(range(8)) == pytest.approx(math.log2(8))


def test_prefer_turn_averages_continuations_and_picks_extremes():
    candidates = ["Is it alive?", "Is it a cat?", "Hello"]
    rewards = [[0.2, 0.4, 0.6], [0.9, 0.7, 0.8], [0.1, 0.0, 0.2]]  # means 0.4, 0.8, 0.1
    pair = prefer_turn(candidates, rewards)
    assert pair is not None
    assert (pair.chosen, pair.rejected) == ("Is it a cat?", "Hello")
    assert pair.mean_rewards == pytest.approx((0.4, 0.8, 0.1))
    assert (pair.chosen_reward, pair.rejected_reward) == pytest.approx((0.8, 0.1))
    assert prefer_turn(["a", "b"], [[0.5, 0.5], [0.5]]) is None  # no preference to learn
    assert prefer_turn(["a", "b"], [[0.5], [0.45]], min_margin=0.1) is None
    with pytest.raises(ValueError):
        prefer_turn(["a", "b"], [[0.5], []])
