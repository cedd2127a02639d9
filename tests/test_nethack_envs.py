"""The papers' NetHack tasks, defined from NLE's task classes: ids, actions, goals, continual variants, seeding."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from nle import nethack

from pipeline.nethack.env import (
    EXTENDED_ACTIONS,
    SUCCESS_REWARD,
    TASK_NAMES,
    TASKS,
    decode_message,
    make_env,
    oracle_glyph,
    seed_env,
)


def test_every_task_is_registered_with_gymnasium_plain_and_extended():
    assert {"score", "staircase", "staircase_lvl3", "staircase_lvl4", "oracle", "oracle_sober",
            "staircase_continual", "oracle_sober_continual"} <= set(TASK_NAMES)
    for spec in TASKS.values():
        assert spec.gym_id in gym.registry
        assert spec.gym_id.replace("-v1", "Extended-v1") in gym.registry
    env = gym.make("curio/NetHackStaircaseLvl3Extended-v1")
    assert env.action_space.n == len(EXTENDED_ACTIONS) == 28
    env.close()


@pytest.mark.parametrize("task", ["score", "staircase_lvl4_continual", "oracle_sober"])
def test_tasks_step_and_report_messages(task):
    env = make_env(task, max_episode_steps=50)
    seed_env(env, 7)
    obs, _ = env.reset()
    # The welcome on any date: the clock is pinned (no full moon, new moon or Friday-the-13th notice instead)
    assert decode_message(obs["message"]).startswith("Hello Agent, welcome to NetHack!")
    done, steps = False, 0
    while not done:
        obs, reward, terminated, truncated, info = env.step(steps % env.action_space.n)
        done, steps = terminated or truncated, steps + 1
    assert steps <= 50 and isinstance(reward, float)
    env.close()


def _with_blstat(obs: tuple, index: int, key: int, value: int) -> tuple:
    blstats = obs[index].copy()
    blstats[key] = value
    return (*obs[:index], blstats, *obs[index + 1 :])


def test_staircase_succeeds_at_its_depth_and_pays_once():
    env = make_env("staircase_lvl3")
    env.reset()
    obs = env.last_observation
    depth2 = _with_blstat(obs, env._blstats_index, nethack.NLE_BL_DEPTH, 2)
    depth3 = _with_blstat(obs, env._blstats_index, nethack.NLE_BL_DEPTH, 3)
    assert env._is_episode_end(depth2) == env.StepStatus.RUNNING
    assert env._reward_fn(obs, 0, depth2, 0) == 0.0
    assert env._is_episode_end(depth3) == env.StepStatus.TASK_SUCCESSFUL
    assert env._reward_fn(obs, 0, depth3, 2) == SUCCESS_REWARD
    assert env._reward_fn(depth3, 0, depth3, 2) == 0.0
    env.close()


def test_continual_variant_keeps_running_after_success():
    env = make_env("staircase_continual")
    env.reset()
    reached = _with_blstat(env.last_observation, env._blstats_index, nethack.NLE_BL_DEPTH, 2)
    assert env._is_episode_end(reached) == env.StepStatus.RUNNING
    assert env._reward_fn(reached, 0, reached, 0) == SUCCESS_REWARD
    assert env._reward_fn(reached, 0, reached, 0) == 0.0
    env.reset()  # a new episode can be rewarded again
    assert env._is_episode_end(reached) == env.StepStatus.RUNNING
    assert env._reward_fn(reached, 0, reached, 0) == SUCCESS_REWARD
    env.close()


def test_oracle_sober_needs_the_oracle_adjacent_and_no_hallucination():
    for task, hallucinating, expected in [("oracle", True, True), ("oracle_sober", False, True),
                                          ("oracle_sober", True, False)]:
        env = make_env(task)
        env.reset()
        obs = env.last_observation
        bl = obs[env._blstats_index]
        x, y = int(bl[nethack.NLE_BL_X]), int(bl[nethack.NLE_BL_Y])
        glyphs = obs[env._glyph_index].copy()
        glyphs[y, x + 1] = oracle_glyph()
        obs = (*obs[: env._glyph_index], glyphs, *obs[env._glyph_index + 1 :])
        obs = _with_blstat(obs, env._blstats_index, nethack.NLE_BL_CONDITION,
                           nethack.BL_MASK_HALLU if hallucinating else 0)
        assert env.goal_reached(obs) is expected, task
        env.close()


def test_one_seed_gives_one_episode():
    def messages(seed: int) -> list[str]:
        env = make_env("score", max_episode_steps=300)
        seed_env(env, seed)
        env.reset()
        rng = np.random.default_rng(seed)
        out, done = [], False
        while not done:
            obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            out.append(decode_message(obs["message"]))
            done = terminated or truncated
        env.close()
        return out

    assert messages(3) == messages(3)
    assert messages(3) != messages(4)
