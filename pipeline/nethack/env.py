"""NetHack tasks of the Motif and ONI papers, defined from NLE's task classes.

nle 1.0 ships only ``-v0`` ids (``NetHackScore-v0``, ``NetHackStaircase-v0`` …). The papers trained on their own
registrations: Staircase / Lvl3 / Lvl4 (reach dungeon level 2 / 3 / 4), Oracle, OracleSober (next to the Oracle
while not hallucinating), "Continual" versions that end only on death, and ONI's extended action set. This
module defines those tasks, registers them with gymnasium under the ``curio/`` namespace and offers
:func:`make_env` for code that wants an env by task name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import gymnasium as gym
import numpy as np
from nle import nethack
from nle.env.base import ASCII_ESC, ASCII_SPACE, SKIP_EXCEPTIONS
from nle.env.tasks import TASK_ACTIONS, NetHackScore, NetHackStaircase

from pipeline.nethack import clock as game_clock

#: ONI's action set: the NLE task actions plus spells, potions, prayer, picking up and paying.
EXTENDED_ACTIONS: tuple = (
    *TASK_ACTIONS,
    nethack.Command.CAST,
    nethack.Command.QUAFF,
    nethack.Command.PRAY,
    nethack.Command.PICKUP,
    nethack.Command.PAY,
)

#: Observation keys Curio asks NLE for: fewer keys make stepping faster; glyphs/blstats/message are
#: what the tasks, the captions and the policy use.
OBSERVATION_KEYS: tuple[str, ...] = ("glyphs", "chars", "blstats", "message")

#: Reward of reaching a goal (Motif's staircase and oracle tasks).
SUCCESS_REWARD = 50.0


def decode_message(message: np.ndarray) -> str:
    """The text of NLE's ``message`` observation (NUL-padded bytes), surrounding blanks removed.

    The one normalisation every consumer shares (captions, reward table, RL), so a message is the same key
    everywhere. latin-1 never fails to decode; NetHack's messages are ASCII anyway.
    """
    return bytes(message).rstrip(b"\0").decode("latin-1").strip()


class Score(NetHackScore):
    """NLE's score task (score delta minus a penalty on steps that freeze game time), with two changes.

    - ``extended_actions`` selects ONI's action set, and then the questions those actions raise ("drink",
      "pray") are left for the agent to answer instead of being declined.
    - A message that NLE clicks past (``--More--``) is kept on the observation when the screen it leads to has
      none: NLE would otherwise lose messages such as "You descend the stairs." that a message-based reward
      needs to see.
    """

    def __init__(self, *args, extended_actions: bool = False, **kwargs) -> None:
        kwargs.setdefault("actions", EXTENDED_ACTIONS if extended_actions else TASK_ACTIONS)
        kwargs.setdefault("observation_keys", OBSERVATION_KEYS)
        self.extended_actions = extended_actions
        self._keep_questions = (*SKIP_EXCEPTIONS, b"drink") if extended_actions else SKIP_EXCEPTIONS
        super().__init__(*args, **kwargs)

    def _perform_known_steps(self, observation, done, exceptions=True):
        skipped: np.ndarray | None = None  # last non-empty message clicked past
        while not done:
            internal = observation[self._internal_index]
            if internal[3]:  # waiting for space (--More--)
                message = observation[self._message_index]
                if message[0]:
                    skipped = message.copy()
                observation, done = self.nethack.step(ASCII_SPACE)
                continue
            if internal[2]:  # asked for a line of text: never typed
                observation, done = self.nethack.step(ASCII_ESC)
                continue
            if internal[1]:  # asked a y/n question
                if exceptions and (
                    self._allow_all_yn_questions
                    or any(q in bytes(observation[self._message_index]) for q in self._keep_questions)
                ):
                    break
                observation, done = self.nethack.step(ASCII_ESC)
            break
        if skipped is not None and not observation[self._message_index][0]:
            i = self._message_index
            observation = (*observation[:i], skipped, *observation[i + 1 :])
        return observation, done


class GoalTask(Score):
    """A task that succeeds on reaching a goal; reward ``SUCCESS_REWARD`` once, on the step it is reached.

    ``continual`` tasks keep going after success until the agent dies (or the step cap): the papers use them
    for intrinsic-only agents, which must not be stopped by an extrinsic goal.
    """

    StepStatus = NetHackStaircase.StepStatus  # adds TASK_SUCCESSFUL
    continual = False

    def __init__(self, *args, **kwargs) -> None:
        self._succeeded = self._rewarded = False
        super().__init__(*args, **kwargs)

    def goal_reached(self, observation) -> bool:
        raise NotImplementedError

    def reset(self, *args, **kwargs):
        self._succeeded = self._rewarded = False
        return super().reset(*args, **kwargs)

    def _is_episode_end(self, observation):
        if not self._succeeded and self.goal_reached(observation):
            self._succeeded = True
        if self._succeeded and not self.continual:
            return self.StepStatus.TASK_SUCCESSFUL
        return self.StepStatus.RUNNING

    def _reward_fn(self, last_observation, action, observation, end_status):
        if self._succeeded and not self._rewarded:
            self._rewarded = True
            return SUCCESS_REWARD
        return 0.0

    def _get_information(self, end_status):
        info = super()._get_information(end_status)
        info["success"] = self._succeeded
        return info


class Staircase(GoalTask):
    """Reach dungeon level ``target_depth`` (2: go down the first staircase)."""

    target_depth = 2

    def goal_reached(self, observation) -> bool:
        # Depth, not the per-branch level number: a level of the Gnomish Mines counts by how deep it is.
        return int(observation[self._blstats_index][nethack.NLE_BL_DEPTH]) >= self.target_depth


class StaircaseLvl3(Staircase):
    target_depth = 3


class StaircaseLvl4(Staircase):
    target_depth = 4


@cache
def oracle_glyph() -> int:
    for glyph in range(nethack.GLYPH_MON_OFF, nethack.GLYPH_PET_OFF):
        if nethack.permonst(nethack.glyph_to_mon(glyph)).mname == "Oracle":
            return glyph
    raise RuntimeError("NetHack has no Oracle monster glyph")


class Oracle(GoalTask):
    """Stand next to the Oracle (on dungeon level 5–9)."""

    def goal_reached(self, observation) -> bool:
        blstats = observation[self._blstats_index]
        x, y = int(blstats[nethack.NLE_BL_X]), int(blstats[nethack.NLE_BL_Y])
        glyphs = observation[self._glyph_index]
        return bool(np.any(glyphs[max(y - 1, 0) : y + 2, max(x - 1, 0) : x + 2] == oracle_glyph()))


class OracleSober(Oracle):
    """Oracle, but not while hallucinating: otherwise eating a hallucinogenic corpse makes some monster look
    like the Oracle, a reward hack agents do find."""

    def goal_reached(self, observation) -> bool:
        condition = int(observation[self._blstats_index][nethack.NLE_BL_CONDITION])
        return not condition & nethack.BL_MASK_HALLU and super().goal_reached(observation)


def _continual(base: type[GoalTask]) -> type[GoalTask]:
    doc = f"{base.__doc__} Ends only on death."
    return type(f"{base.__name__}Continual", (base,), {"continual": True, "__doc__": doc})


@dataclass(frozen=True)
class TaskSpec:
    name: str  # params.yaml name
    cls: type[Score]
    gym_id: str  # gymnasium id, under the curio/ namespace


def _tasks() -> dict[str, TaskSpec]:
    base: dict[str, type[Score]] = {
        "score": Score,
        "staircase": Staircase,
        "staircase_lvl3": StaircaseLvl3,
        "staircase_lvl4": StaircaseLvl4,
        "oracle": Oracle,
        "oracle_sober": OracleSober,
    }
    for name in ("staircase", "staircase_lvl3", "staircase_lvl4", "oracle", "oracle_sober"):
        base[f"{name}_continual"] = _continual(base[name])  # type: ignore[arg-type]
    titles = {"score": "Score", "oracle_sober": "OracleSober", "staircase_lvl3": "StaircaseLvl3",
              "staircase_lvl4": "StaircaseLvl4"}

    def title(name: str) -> str:
        stem = name.removesuffix("_continual")
        return titles.get(stem, stem.capitalize()) + ("Continual" if name.endswith("_continual") else "")

    return {name: TaskSpec(name, cls, f"curio/NetHack{title(name)}-v1") for name, cls in base.items()}


TASKS: dict[str, TaskSpec] = _tasks()
TASK_NAMES: tuple[str, ...] = tuple(TASKS)


def register_tasks() -> None:
    """Register every task (and its extended-action twin, ``…Extended-v1``) with gymnasium; idempotent."""
    for spec in TASKS.values():
        for gym_id, extended in ((spec.gym_id, False), (spec.gym_id.replace("-v1", "Extended-v1"), True)):
            if gym_id not in gym.registry:
                # NLE's envs break under gymnasium's order-enforcing wrapper (see nle/env/__init__.py).
                gym.register(
                    gym_id, entry_point=spec.cls, kwargs={"extended_actions": extended}, order_enforce=False
                )


def make_env(
    task: str,
    *,
    extended_actions: bool = False,
    max_episode_steps: int = 5000,
    observation_keys: Sequence[str] = OBSERVATION_KEYS,
    clock: str = game_clock.DEFAULT_CLOCK,
) -> Score:
    """A fresh NLE env of the named task (see ``TASK_NAMES``), its game clock pinned to ``clock``.

    Raises ``clock.ClockError`` when the clock cannot be pinned in this process (see ``pipeline.nethack.clock``).
    """
    if task not in TASKS:
        raise KeyError(f"unknown NetHack task {task!r} (known: {', '.join(TASK_NAMES)})")
    game_clock.pin(clock)
    return TASKS[task].cls(
        extended_actions=extended_actions,
        max_episode_steps=max_episode_steps,
        observation_keys=tuple(observation_keys),
    )


def seed_env(env: Score, seed: int) -> None:
    """Make the next episode of ``env`` reproducible from one integer: NetHack's core and display RNGs, with
    NetHack's own reseeding from true randomness turned off. (nle 1.0 has no separate level-generator RNG; gym's
    ``reset(seed=)`` seeds only gym's generator, which NetHack never reads.)"""
    core = nethack_core_seed(seed)
    env.seed(core, core ^ 0x5A5A5A5A, reseed=False)


def nethack_core_seed(seed: int) -> int:
    """The core seed NetHack gets for an episode seeded with ``seed`` (two seeds play the same game when these
    agree, so unseen-seed checks compare them)."""
    return seed & 0x7FFFFFFF


register_tasks()
