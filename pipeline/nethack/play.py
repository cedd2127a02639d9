"""Playing NetHack episodes with a random or a trained policy: per-step records (rollouts) and per-episode
summaries (evaluation).

Every episode is reproducible from one integer seed: it seeds NetHack's RNGs and, for the random policy, the
action stream. A trained policy steps several envs in lockstep so that its network runs on a batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from nle import nethack

from pipeline.nethack.clock import DEFAULT_CLOCK
from pipeline.nethack.env import OBSERVATION_KEYS, decode_message, make_env, seed_env

BLSTATS_SIZE = nethack.NLE_BLSTATS_SIZE
MESSAGE_SIZE = 256  # bytes of NLE's message observation
TTY_SHAPE = (24, 80)  # NLE's terminal: message line, 21 map rows, two status lines
TTY_SIZE = TTY_SHAPE[0] * TTY_SHAPE[1]
SCORE, DEPTH, XLVL = nethack.NLE_BL_SCORE, nethack.NLE_BL_DEPTH, nethack.NLE_BL_XP

STEP_SCHEMA = pa.schema(
    [
        pa.field("episode", pa.int32()),  # global episode index
        pa.field("step", pa.int32()),  # 0 = the observation after reset
        pa.field("action", pa.int16()),  # action that led here (-1 at step 0)
        pa.field("reward", pa.float32()),  # task reward of that action
        pa.field("message", pa.string()),  # decoded game message of this observation ("" = none)
        pa.field("blstats", pa.list_(pa.int32(), BLSTATS_SIZE)),
        pa.field("done", pa.bool_()),
    ]
)
#: Steps with the terminal each observation showed: ``tty_chars``, NLE's 24 x 80 characters row by row (what a
#: replay draws; consecutive frames differ in a few characters, which Parquet's compression finds).
FRAME_STEP_SCHEMA = STEP_SCHEMA.append(pa.field("tty_chars", pa.binary(TTY_SIZE)))
#: evaluate-nethack's replays: the steps of several policies' episodes (the same seeds), each row naming its policy.
REPLAY_STEP_SCHEMA = pa.schema([pa.field("policy", pa.string()), *FRAME_STEP_SCHEMA])

EPISODE_SCHEMA = pa.schema(
    [
        pa.field("policy", pa.string()),
        pa.field("episode", pa.int32()),
        pa.field("seed", pa.int64()),
        pa.field("return", pa.float64()),  # sum of task rewards
        pa.field("score", pa.int64()),  # best in-game score seen (NLE zeroes blstats after death)
        pa.field("depth", pa.int32()),  # deepest dungeon level reached
        pa.field("xlvl", pa.int32()),  # highest experience level reached
        pa.field("length", pa.int32()),  # steps
        pa.field("success", pa.bool_()),  # goal tasks: goal reached
        pa.field("end_status", pa.int8()),  # NLE StepStatus: -1 aborted (step cap), 1 death, 2 task success
    ]
)


@dataclass
class EnvSpec:
    task: str
    extended_actions: bool = False
    max_episode_steps: int = 5000
    frames: bool = False  # observe tty_chars too (StepRecorder(frames=True) stores them)
    clock: str = DEFAULT_CLOCK  # the date and time the game sees (pipeline.nethack.clock)

    def make(self):
        keys = (*OBSERVATION_KEYS, "tty_chars") if self.frames else OBSERVATION_KEYS
        return make_env(
            self.task, extended_actions=self.extended_actions, max_episode_steps=self.max_episode_steps,
            observation_keys=keys, clock=self.clock,
        )


class StepRecorder:
    """Columns of a step table. The per-step cost is a few list appends and two row copies into preallocated
    arrays (no per-step objects for the GC to track); messages are decoded once per distinct text in
    :meth:`table`, not once per step — NetHack repeats the same few hundred messages."""

    def __init__(self, capacity: int = 16384, frames: bool = False) -> None:
        self.episode: list[int] = []
        self.step: list[int] = []
        self.action: list[int] = []
        self.reward: list[float] = []
        self.done: list[bool] = []
        self._blstats = np.empty((capacity, BLSTATS_SIZE), dtype=np.int32)
        self._messages = np.empty((capacity, MESSAGE_SIZE), dtype=np.uint8)
        self._frames = np.empty((capacity, TTY_SIZE), dtype=np.uint8) if frames else None
        self._n = 0

    def add(self, episode: int, step: int, action: int, reward: float, obs: dict, done: bool) -> None:
        n = self._n
        if n == len(self._blstats):
            self._blstats = np.concatenate([self._blstats, np.empty_like(self._blstats)])
            self._messages = np.concatenate([self._messages, np.empty_like(self._messages)])
            if self._frames is not None:
                self._frames = np.concatenate([self._frames, np.empty_like(self._frames)])
        self._blstats[n] = obs["blstats"]  # copied: NLE reuses its arrays between steps
        self._messages[n] = obs["message"]
        if self._frames is not None:
            self._frames[n] = obs["tty_chars"].reshape(-1)
        self._n = n + 1
        self.episode.append(episode)
        self.step.append(step)
        self.action.append(action)
        self.reward.append(reward)
        self.done.append(done)

    @property
    def messages(self) -> list[str]:
        """Decoded messages, one per recorded step."""
        raw = self._messages[: self._n]
        if not len(raw):
            return []
        distinct, inverse = np.unique(raw.view(f"V{MESSAGE_SIZE}").ravel(), return_inverse=True)
        texts = [decode_message(np.frombuffer(v.tobytes(), dtype=np.uint8)) for v in distinct]
        return [texts[i] for i in inverse]

    def table(self) -> pa.Table:
        blstats = self._blstats[: self._n].reshape(-1)
        frames = {}
        if self._frames is not None:  # one fixed-size binary value per step, straight from the buffer
            frames["tty_chars"] = pa.FixedSizeBinaryArray.from_buffers(
                pa.binary(TTY_SIZE), self._n, [None, pa.py_buffer(self._frames[: self._n].tobytes())])
        return pa.table(
            {
                "episode": pa.array(self.episode, pa.int32()),
                "step": pa.array(self.step, pa.int32()),
                "action": pa.array(self.action, pa.int16()),
                "reward": pa.array(self.reward, pa.float32()),
                "message": pa.array(self.messages, pa.string()),
                "blstats": pa.FixedSizeListArray.from_arrays(pa.array(blstats, pa.int32()), BLSTATS_SIZE),
                "done": pa.array(self.done, pa.bool_()),
                **frames,
            },
            schema=FRAME_STEP_SCHEMA if frames else STEP_SCHEMA,
        )


@dataclass
class EpisodeSummary:
    episode: int
    seed: int
    ret: float = 0.0
    score: int = 0
    depth: int = 1
    xlvl: int = 1
    length: int = 0
    last_info: dict = field(default_factory=dict, repr=False)

    def update(self, reward: float, obs: dict, info: dict) -> None:
        self.ret += reward
        self.length += 1
        bl = obs["blstats"]
        if bl[SCORE] > self.score:
            self.score = int(bl[SCORE])
        if bl[DEPTH] > self.depth:
            self.depth = int(bl[DEPTH])
        if bl[XLVL] > self.xlvl:
            self.xlvl = int(bl[XLVL])
        self.last_info = info  # success and end status: the last step's info says it

    def row(self, policy: str) -> dict:
        return {"policy": policy, "episode": self.episode, "seed": self.seed, "return": self.ret,
                "score": self.score, "depth": self.depth, "xlvl": self.xlvl, "length": self.length,
                "success": bool(self.last_info.get("success", False)),
                "end_status": int(self.last_info.get("end_status", 0))}


OnStep = Callable[[int, int, int, float, dict, bool], None]  # (episode, step, action, reward, obs, done)


def play_random(
    spec: EnvSpec, episodes: list[int], seeds: list[int], on_step: OnStep | None = None
) -> list[EpisodeSummary]:
    """Uniform random actions, one env, episodes in order; each episode's actions come from its own seed."""
    env = spec.make()
    n_actions = env.action_space.n
    summaries = []
    try:
        for episode, seed in zip(episodes, seeds, strict=True):
            seed_env(env, seed)
            rng = np.random.default_rng(seed)
            obs, _ = env.reset()
            if on_step is not None:
                on_step(episode, 0, -1, 0.0, obs, False)
            summary = EpisodeSummary(episode, seed)
            # Draw actions in blocks: one generator call per step would cost as much as the recording.
            actions = rng.integers(n_actions, size=1024)
            step, done = 0, False
            while not done:
                if step and step % len(actions) == 0:
                    actions = rng.integers(n_actions, size=1024)
                action = int(actions[step % len(actions)])
                obs, reward, terminated, truncated, info = env.step(action)
                step += 1
                done = terminated or truncated
                summary.update(reward, obs, info)
                if on_step is not None:
                    on_step(episode, step, action, reward, obs, done)
            summaries.append(summary)
    finally:
        env.close()
    return summaries


def play_policy(
    spec: EnvSpec,
    policy: Any,
    episodes: list[int],
    seeds: list[int],
    parallel_envs: int = 8,
    on_step: OnStep | None = None,
) -> list[EpisodeSummary]:
    """A trained policy (``pipeline.nethack.sf.TrainedPolicy``) on ``parallel_envs`` envs in lockstep.

    Episodes are handed out in order to whichever env is free, so the assignment (and with a seeded torch RNG,
    the actions) depend only on the inputs.
    """
    queue = list(zip(episodes, seeds, strict=True))
    envs = [spec.make() for _ in range(min(parallel_envs, len(queue)))]
    states = policy.initial_state(len(envs))
    current: list[EpisodeSummary | None] = [None] * len(envs)
    obs: list[dict | None] = [None] * len(envs)
    steps = [0] * len(envs)
    finished: list[EpisodeSummary] = []

    def start(i: int) -> None:
        episode, seed = queue.pop(0)
        seed_env(envs[i], seed)
        obs[i], _ = envs[i].reset()
        current[i], steps[i] = EpisodeSummary(episode, seed), 0
        states[i].zero_()
        if on_step is not None:
            on_step(episode, 0, -1, 0.0, obs[i], False)

    try:
        for i in range(len(envs)):
            start(i)
        while any(c is not None for c in current):
            live = [i for i, c in enumerate(current) if c is not None]
            actions, new_states = policy.act([obs[i] for i in live], states[live])
            states[live] = new_states
            for i, action in zip(live, actions.tolist(), strict=True):
                obs[i], reward, terminated, truncated, info = envs[i].step(int(action))
                steps[i] += 1
                done = terminated or truncated
                summary = current[i]
                assert summary is not None
                summary.update(reward, obs[i], info)
                if on_step is not None:
                    on_step(summary.episode, steps[i], int(action), reward, obs[i], done)
                if done:
                    finished.append(summary)
                    current[i] = None
                    if queue:
                        start(i)
    finally:
        for env in envs:
            env.close()
    return sorted(finished, key=lambda s: s.episode)
