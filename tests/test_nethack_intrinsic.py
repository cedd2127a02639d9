"""The Motif/ONI intrinsic reward against hand-computed values, and the Motif threshold bugs' regressions."""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import pytest

from pipeline.nethack.intrinsic import EpisodicIntrinsicReward, MessageRewards
from pipeline.nethack.reward import RewardStats
from pipeline.nethack.sf import IntrinsicRewardWrapper, optional_quantile

R = {"You kill the newt!": 2.0, "You see here 3 gold pieces.": 0.8, "It's a wall.": -1.0, "": 0.1}


def reward(**kwargs) -> EpisodicIntrinsicReward:
    defaults = dict(ext_coef=1.0, int_coef=1.0, count_exponent=3.0, threshold=None)
    return EpisodicIntrinsicReward(R.__getitem__, **{**defaults, **kwargs})


def test_threshold_keeps_only_rewards_above_epsilon():
    r = reward(threshold=0.8)
    assert r.intrinsic("You kill the newt!") == 2.0  # 2.0 > 0.8
    assert r.intrinsic("You see here 3 gold pieces.") == 0.0  # not strictly above ε
    assert r.intrinsic("It's a wall.") == 0.0
    assert r.intrinsic("") == 0.0


def test_threshold_off_passes_every_reward_through_including_negative_ones():
    r = reward(threshold=None)
    assert r.intrinsic("It's a wall.") == -1.0
    assert r.intrinsic("") == pytest.approx(0.1)


def test_count_exponent_divides_by_episode_count_to_the_beta():
    r = reward(count_exponent=3.0)
    got = [r.intrinsic("You kill the newt!") for _ in range(4)]
    assert got == pytest.approx([2.0, 2.0 / 8, 2.0 / 27, 2.0 / 64])
    # Counts are per message: another message starts at 1.
    assert r.intrinsic("You see here 3 gold pieces.") == pytest.approx(0.8)
    r2 = reward(count_exponent=0.5)
    assert [r2.intrinsic("It's a wall.") for _ in range(2)] == pytest.approx([-1.0, -1.0 / np.sqrt(2)])


def test_counts_restart_every_episode():
    r = reward()
    r.intrinsic("You kill the newt!")
    r.intrinsic("You kill the newt!")
    r.reset()
    assert r.intrinsic("You kill the newt!") == 2.0
    assert r.counts == {"You kill the newt!": 1}


def test_step_mixes_extrinsic_and_intrinsic_with_their_coefficients():
    r = reward(ext_coef=0.1, int_coef=0.5, threshold=0.0)
    total, r_int = r.step("You kill the newt!", r_ext=20.0)
    assert r_int == 2.0
    assert total == pytest.approx(0.1 * 20.0 + 0.5 * 2.0)
    total, r_int = r.step("You kill the newt!", r_ext=0.0)
    assert total == pytest.approx(0.5 * 2.0 / 8)
    total, r_int = r.step("It's a wall.", r_ext=-0.01)  # below ε: only the extrinsic part
    assert (total, r_int) == (pytest.approx(-0.001), 0.0)


def test_extrinsic_only_never_asks_the_model():
    def boom(message: str) -> float:
        raise AssertionError("reward model called")

    r = EpisodicIntrinsicReward(boom, ext_coef=1.0, int_coef=0.0)
    assert r.step("You kill the newt!", 3.0) == (3.0, 0.0)
    with pytest.raises(ValueError):
        EpisodicIntrinsicReward(None, ext_coef=1.0, int_coef=0.1)


def test_message_rewards_score_in_batches_and_cache_by_message():
    calls: list[list[str]] = []

    def score(texts: list[str]) -> np.ndarray:
        calls.append(list(texts))
        return np.array([float(len(t)) for t in texts])

    rewards = MessageRewards(score)
    rewards.prefill(["ab", "abc", "ab", ""])
    assert calls == [["ab", "abc", ""]]  # one batch, each message once
    assert [rewards("ab"), rewards("abc"), rewards("")] == [2.0, 3.0, 0.0]
    assert rewards.misses == 0 and len(calls) == 1
    assert rewards("abcd") == 4.0 and rewards("abcd") == 4.0
    assert rewards.misses == 1 and calls[-1] == ["abcd"]


# -- Motif's threshold bugs: it could not be turned off, and levels outside the saved ones crashed -------------
def test_threshold_option_can_be_turned_off():
    assert optional_quantile("none") is None
    assert optional_quantile("off") is None
    assert optional_quantile("0.0") == 0.0  # a real level, not "off" (Motif treated '0.0' as off)
    assert optional_quantile("0.5") == 0.5
    with pytest.raises(argparse.ArgumentTypeError):
        optional_quantile("1.5")


def test_threshold_at_any_quantile_level_interpolates_between_saved_ones():
    stats = RewardStats(mean=1.0, std=2.0, quantile_levels=[0.0, 0.5, 1.0], quantile_values=[-2.0, 0.0, 4.0])
    assert stats.threshold(None) is None
    assert stats.threshold(0.5) == 0.0
    assert stats.threshold(0.75) == pytest.approx(2.0)  # not a saved level: interpolated, no crash
    assert stats.threshold(0.0) == -2.0
    with pytest.raises(ValueError):
        stats.threshold(1.2)
    assert stats.normalize(5.0) == 2.0


# -- the wrapper sample-factory sees -----------------------------------------------------------------------
class ScriptedEnv(gym.Env):
    """Plays a fixed list of (message, task reward) steps, then terminates."""

    def __init__(self, script: list[tuple[str, float]]) -> None:
        self.script = script
        self.observation_space = gym.spaces.Dict(
            message=gym.spaces.Box(0, 255, (256,), np.uint8), blstats=gym.spaces.Box(0, 1e9, (27,), np.int64)
        )
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self, message: str) -> dict:
        buf = np.zeros(256, np.uint8)
        buf[: len(message)] = np.frombuffer(message.encode(), np.uint8)
        blstats = np.zeros(27, np.int64)
        blstats[9], blstats[12] = 7 * self.t, 1 + self.t // 2  # score, depth
        return {"message": buf, "blstats": blstats}

    def reset(self, **kwargs):
        self.t = 0
        return self._obs("Hello Agent"), {}

    def step(self, action):
        message, r = self.script[self.t]
        self.t += 1
        return self._obs(message), r, self.t == len(self.script), False, {}


def test_wrapper_rewards_and_episode_stats_by_hand():
    script = [("You kill the newt!", 4.0), ("", 0.0), ("You kill the newt!", 0.0), ("It's a wall.", -0.01)]
    inner = reward(ext_coef=0.1, int_coef=1.0, threshold=0.0)
    env = IntrinsicRewardWrapper(ScriptedEnv(script), inner)
    for _episode in range(2):  # the second episode must see fresh counts
        env.reset()
        totals, info = [], {}
        for _ in script:
            _, total, terminated, _, info = env.step(0)
            totals.append(total)
        assert totals == pytest.approx([0.4 + 2.0, 0.1, 2.0 / 8, -0.001])
        assert terminated
        stats = info["episode_extra_stats"]
        assert stats["intrinsic_return"] == pytest.approx(2.0 + 0.1 + 0.25)
        assert stats["extrinsic_return"] == pytest.approx(3.99)
        assert info["true_objective"] == pytest.approx(3.99)
        assert (stats["score"], stats["depth"]) == (28, 3)
