"""sample-factory 2.x integration for NetHack, through its public extension points only.

- ``register_env(ENV_NAME, make_nethack_env)``: the task env wrapped with the intrinsic reward
  (:class:`IntrinsicRewardWrapper`) and the policy's view of the game (:class:`PolicyObservation`).
- ``global_model_factory().register_encoder_factory(NetHackEncoder)``: a small encoder (a conv over the characters
  around the agent + an MLP over the bottom-line stats) that trains at thousands of frames/s on a CPU.
- ONI's online rewards (``--intrinsic_reward`` retrieval / classification / ranking / cosine): the env wrapper reads
  the annotator's published table (``oni.OnlineRewards``) and an ``AlgoObserver`` runs the annotator process
  beside training (started with the runner, restarted if it dies, progress logged by env steps).
- Episode statistics (extrinsic return, score, depth, intrinsic return) reach sample-factory's summaries through
  ``info["episode_extra_stats"]`` and ``info["true_objective"]``.

Training runs as ``python -m pipeline.nethack --experiment NAME --train_dir DIR …`` (a separate process, so
sample-factory's global registries, signal handlers and worker processes never leak into the caller); rerunning
the same command resumes from the latest checkpoint (``--restart_behavior resume``). How the trainer stops on SIGTERM
or SIGINT, within its grace period and when its parent dies: :mod:`pipeline.nethack.sf_process`.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from nle import nethack
from sample_factory.model.encoder import Encoder
from torch import nn

from pipeline.core.artifacts import atomic_write_json
from pipeline.llm import online_annotation
from pipeline.models.reward_net_config import MOTIF_COUNT_EXPONENT
from pipeline.nethack import oni, sf_compat
from pipeline.nethack.clock import DEFAULT_CLOCK
from pipeline.nethack.env import (
    EXTENDED_ACTIONS,
    TASK_ACTIONS,
    TASK_NAMES,
    decode_message,
    make_env,
    nethack_core_seed,
    seed_env,
)
from pipeline.nethack.intrinsic import EpisodicIntrinsicReward, MessageRewards
from pipeline.nethack.oni import ONLINE_REWARDS, REWARD_TYPES, online_rewards
from pipeline.nethack.reward import load_reward_model
from pipeline.nethack.sf_process import STOPPED_EXIT, StopRequest, grace_from_env, start_shm_manager, watch_parent

sf_compat.apply()  # at import: sample-factory's spawned workers import this module too (sf_compat.py says why)

ENV_NAME = "curio_nethack"
BLSTATS_SIZE = nethack.NLE_BLSTATS_SIZE
TABLE = "message_rewards.json"  # r̃ of the training messages, written next to the reward model


# -- configuration -------------------------------------------------------------------------------------------
def optional_quantile(text: str) -> float | None:
    """``none`` / ``off`` → no threshold; otherwise a quantile level in [0, 1].

    Motif compared this float option with the string '0.0' to decide whether the threshold was on, so it could
    never be turned off; here "off" is its own value.
    """
    if text.strip().lower() in {"none", "off", "null", ""}:
        return None
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"threshold quantile {value} is outside [0, 1]")
    return value


def add_nethack_args(parser: argparse.ArgumentParser) -> None:
    from sample_factory.utils.utils import str2bool

    p = parser
    p.add_argument("--nethack_task", default="score", choices=TASK_NAMES, help="Curio NetHack task name")
    p.add_argument("--nethack_extended_actions", default=False, type=str2bool, help="ONI's extended action set")
    p.add_argument("--nethack_max_episode_steps", default=5000, type=int, help="step cap of one episode")
    p.add_argument("--nethack_clock", default=DEFAULT_CLOCK, type=str,
                   help="the date and time the game sees, 'YYYY-MM-DD HH:MM:SS' (pipeline.nethack.clock)")
    p.add_argument("--nethack_deterministic", default=False, type=str2bool,
                   help="torch's deterministic algorithms (with --serial_mode, --async_rl=False and --seed: "
                   "two runs give the same checkpoints)")
    p.add_argument("--crop_size", default=9, type=int, help="side of the character crop around the agent")
    p.add_argument("--reward_model_dir", default="", type=str, help="trained message reward model ('' = none)")
    p.add_argument("--ext_coef", default=1.0, type=float, help="weight of the task (extrinsic) reward")
    p.add_argument("--int_coef", default=0.0, type=float, help="weight of the intrinsic reward")
    p.add_argument("--count_exponent", default=MOTIF_COUNT_EXPONENT, type=float,
                   help="beta: r_int is divided by N_ep(m)^beta")
    p.add_argument("--threshold_quantile", default=None, type=optional_quantile,
                   help="epsilon as a quantile of the normalised reward; 'none' = no threshold")
    p.add_argument("--intrinsic_reward", default="motif", choices=REWARD_TYPES,
                   help="motif: the offline reward model; retrieval/classification/ranking/cosine: ONI's online "
                   "rewards (an annotator process labels messages while training runs); none: extrinsic only")
    p.add_argument("--oni_config", default="{}", type=str, help="JSON settings of the ONI annotator (oni.DEFAULTS)")
    p.add_argument("--oni_refresh_s", default=2.0, type=float, help="how often workers re-read the reward table")


# Sizes for a 2-core CPU machine: a few thousand frames/s. Anything here can be overridden on the command line.
CPU_DEFAULTS: dict[str, Any] = dict(
    algo="APPO",
    env=ENV_NAME,
    device="cpu",
    serial_mode=True,  # one process: on 2 cores it beat the parallel runner (~2.3k vs ~2.0k frames/s)
    num_workers=1,
    num_envs_per_worker=16,
    worker_num_splits=1,
    rollout=32,
    batch_size=1024,
    num_batches_per_epoch=1,
    num_epochs=1,
    normalize_input=False,  # the crop holds character codes (embedding indices), not magnitudes
    use_rnn=False,
    rnn_size=128,
    decoder_mlp_layers=[],
    learning_rate=3e-4,
    gamma=0.999,
    reward_scale=0.1,
    exploration_loss_coeff=0.01,
    value_loss_coeff=0.5,
    max_grad_norm=4.0,
    restart_behavior="resume",
    save_every_sec=30,
    keep_checkpoints=2,
    save_best_every_sec=1_000_000,  # "best" needs a stable metric; latest is what resume and evaluate use
    experiment_summaries_interval=10,
    with_wandb=False,
    set_workers_cpu_affinity=False,  # other processes share these cores
    decorrelate_envs_on_one_worker=False,
)


def parse_cfg(argv: list[str], evaluation: bool = False) -> argparse.Namespace:
    from sample_factory.cfg.arguments import parse_full_cfg, parse_sf_args

    if not any(a == "--env" or a.startswith("--env=") for a in argv):
        argv = [f"--env={ENV_NAME}", *argv]  # sample-factory's first parsing pass insists on --env
    parser, _ = parse_sf_args(argv, evaluation=evaluation)
    add_nethack_args(parser)
    parser.set_defaults(**CPU_DEFAULTS)
    return parse_full_cfg(parser, argv)


# -- env -----------------------------------------------------------------------------------------------------
class IntrinsicRewardWrapper(gym.Wrapper):
    """Replaces the task reward by ext_coef·r_ext + int_coef·r_int and reports per-episode statistics."""

    def __init__(self, env: gym.Env, reward: EpisodicIntrinsicReward) -> None:
        super().__init__(env)
        self.reward = reward
        self._zero_episode()

    def _zero_episode(self) -> None:
        self.ext_return = self.int_return = 0.0
        self.length = 0
        self.score = self.depth = 0

    def reset(self, **kwargs):
        self.reward.reset()
        self._zero_episode()
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, r_ext, terminated, truncated, info = self.env.step(action)
        total, r_int = self.reward.step(decode_message(obs["message"]), r_ext)
        self.ext_return += r_ext
        self.int_return += r_int
        self.length += 1
        blstats = obs["blstats"]
        # After death NLE zeroes blstats, so keep the best values seen during the episode.
        self.score = max(self.score, int(blstats[nethack.NLE_BL_SCORE]))
        self.depth = max(self.depth, int(blstats[nethack.NLE_BL_DEPTH]))
        if terminated or truncated:
            info["true_objective"] = self.ext_return
            info["episode_extra_stats"] = {
                "extrinsic_return": self.ext_return,
                "intrinsic_return": self.int_return,
                "score": self.score,
                "depth": self.depth,
                "success": float(info.get("success", False)),
            }
        return obs, total, terminated, truncated, info


def episode_seed(seed: int, env_id: int, episode: int) -> int:
    """NetHack's seed of a training env's ``episode``-th game, from the run's seed and the env's global index."""
    return int(np.random.SeedSequence([seed, env_id, episode]).generate_state(1)[0])


class SeededEpisodes(gym.Wrapper):
    """Seeds NetHack's own RNGs (core and display, no reseeding) before every game of a training env, from the run
    seed, the env's global index (worker × envs per worker + vector index) and the game's number.

    sample-factory seeds an env through gym's ``reset(seed=)``, which NetHack never reads; without this, every
    game starts from true randomness. With ``record`` (a directory), the number of games the env has begun is kept
    in ``record/env_<id>.json`` (the most over resumes), so evaluation can tell which seeds training played
    (:func:`training_seed_cores`)."""

    def __init__(self, env: gym.Env, seed: int, env_id: int, record: Path | None = None) -> None:
        super().__init__(env)
        self.base_seed, self.env_id, self.episode = seed, env_id, 0
        self.record = record / f"env_{env_id}.json" if record is not None else None
        self.recorded = _games(self.record) if self.record is not None else 0

    def reset(self, **kwargs):
        seed_env(self.env.unwrapped, episode_seed(self.base_seed, self.env_id, self.episode))
        self.episode += 1
        if self.record is not None and self.episode > self.recorded:  # before the game is played
            self.record.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.record, {"seed": self.base_seed, "env_id": self.env_id, "games": self.episode})
            self.recorded = self.episode
        return self.env.reset(**kwargs)


SEEDS_PLAYED = "curio_seeds"  # per experiment: env_<id>.json, the games each training env has begun


def _games(path: Path) -> int:
    return int(json.loads(path.read_text())["games"]) if path.exists() else 0


def training_seed_cores(experiment_dir: str | Path) -> set[int] | None:
    """NetHack's core seeds of every game an experiment's training envs have begun (``SeededEpisodes``'s
    records); None when it has no record (trained before records were kept)."""
    files = sorted(Path(experiment_dir, SEEDS_PLAYED).glob("env_*.json"))
    if not files:
        return None
    cores: set[int] = set()
    for f in files:
        rec = json.loads(f.read_text())
        cores.update(nethack_core_seed(episode_seed(rec["seed"], rec["env_id"], k)) for k in range(rec["games"]))
    return cores


class PolicyView:
    """What the policy sees: the characters in a square around the agent and transformed bottom-line stats."""

    def __init__(self, crop_size: int = 9) -> None:
        self.radius = r = crop_size // 2
        rows, cols = nethack.DUNGEON_SHAPE
        self._padded = np.zeros((rows + 2 * r, cols + 2 * r), dtype=np.uint8)
        self.space = gym.spaces.Dict(
            crop=gym.spaces.Box(0, 255, (2 * r + 1, 2 * r + 1), dtype=np.uint8),
            blstats=gym.spaces.Box(-np.inf, np.inf, (BLSTATS_SIZE,), dtype=np.float32),
        )

    def __call__(self, obs: dict) -> dict:
        r = self.radius
        rows, cols = nethack.DUNGEON_SHAPE
        self._padded[r : r + rows, r : r + cols] = obs["chars"]
        x, y = int(obs["blstats"][nethack.NLE_BL_X]), int(obs["blstats"][nethack.NLE_BL_Y])
        crop = self._padded[y : y + 2 * r + 1, x : x + 2 * r + 1].copy()
        bl = obs["blstats"].astype(np.float32)
        # Stats span 0..1e6 (score, time): a signed log keeps them on one scale without running statistics.
        return {"crop": crop, "blstats": np.sign(bl) * np.log1p(np.abs(bl))}


class PolicyObservation(gym.ObservationWrapper):
    def __init__(self, env: gym.Env, crop_size: int = 9) -> None:
        super().__init__(env)
        self.view = PolicyView(crop_size)
        self.observation_space = self.view.space

    def observation(self, obs: dict) -> dict:
        return self.view(obs)


_MESSAGE_REWARDS: dict[str, MessageRewards] = {}


def message_rewards(directory: str) -> MessageRewards:
    """One cache per process and reward model, shared by all envs of a sample-factory worker."""
    if directory not in _MESSAGE_REWARDS:
        rewards = MessageRewards.from_directory(directory)
        table = Path(directory) / TABLE
        if table.exists():  # r̃ of every training message, computed in one batch by train-reward
            rewards.preload(json.loads(table.read_text()))
        _MESSAGE_REWARDS[directory] = rewards
    return _MESSAGE_REWARDS[directory]


def threshold_value(directory: str, quantile: float | None) -> float | None:
    if quantile is None or not directory:
        return None
    return load_reward_model(directory)[1].threshold(quantile)


def oni_directory(cfg: Any) -> Path:
    """Where an experiment's online annotation lives (spools, labels, model, table, status)."""
    return Path(cfg.train_dir) / cfg.experiment / "oni"


def make_nethack_env(full_env_name: str, cfg: Any = None, env_config: Any = None, render_mode: str | None = None):
    """sample-factory's env factory signature: (full_env_name, cfg, env_config, render_mode)."""
    env = make_env(
        cfg.nethack_task,
        extended_actions=cfg.nethack_extended_actions,
        max_episode_steps=cfg.nethack_max_episode_steps,
        clock=getattr(cfg, "nethack_clock", DEFAULT_CLOCK),
    )
    if cfg.seed is not None:
        record = Path(cfg.train_dir) / cfg.experiment / SEEDS_PLAYED
        env = SeededEpisodes(env, cfg.seed, int((env_config or {}).get("env_id", 0)), record)
    kind = getattr(cfg, "intrinsic_reward", "motif")
    if kind == "none" and cfg.int_coef != 0:
        raise ValueError("--intrinsic_reward=none needs --int_coef=0")
    if kind in ONLINE_REWARDS and cfg.int_coef != 0:
        # ONI's reward types carry their own thresholds; the count exponent applies to all of them.
        reward = EpisodicIntrinsicReward(
            online_rewards(oni_directory(cfg), cfg.oni_refresh_s),
            ext_coef=cfg.ext_coef,
            int_coef=cfg.int_coef,
            count_exponent=cfg.count_exponent,
        )
        return PolicyObservation(IntrinsicRewardWrapper(env, reward), crop_size=cfg.crop_size)
    use_model = cfg.int_coef != 0
    if use_model and not cfg.reward_model_dir:
        raise ValueError("--int_coef != 0 needs --reward_model_dir")
    reward = EpisodicIntrinsicReward(
        message_rewards(cfg.reward_model_dir) if use_model else None,
        ext_coef=cfg.ext_coef,
        int_coef=cfg.int_coef,
        count_exponent=cfg.count_exponent,
        threshold=threshold_value(cfg.reward_model_dir, cfg.threshold_quantile) if use_model else None,
    )
    return PolicyObservation(IntrinsicRewardWrapper(env, reward), crop_size=cfg.crop_size)


# -- model ---------------------------------------------------------------------------------------------------
class NetHackEncoder(Encoder):
    """Embedded character crop → two 3×3 convs → linear, concatenated with an MLP over the stats."""

    def __init__(self, cfg: Any, obs_space: gym.spaces.Dict) -> None:
        super().__init__(cfg)
        side = obs_space["crop"].shape[0]
        self.embed = nn.Embedding(256, 16)
        self.conv = nn.Sequential(nn.Conv2d(16, 32, 3), nn.ELU(), nn.Conv2d(32, 32, 3), nn.ELU())
        self.crop_fc = nn.Sequential(nn.Linear(32 * (side - 4) ** 2, 128), nn.ELU())
        self.blstats_fc = nn.Sequential(nn.Linear(obs_space["blstats"].shape[0], 64), nn.ELU())
        self.out_size = 128 + 64

    def type_for_input_tensor(self, input_tensor_name: str) -> torch.dtype:
        return torch.long if input_tensor_name == "crop" else torch.float32

    def forward(self, obs_dict: dict[str, torch.Tensor]) -> torch.Tensor:
        crop = self.embed(obs_dict["crop"]).permute(0, 3, 1, 2)
        crop = self.crop_fc(self.conv(crop).flatten(1))
        return torch.cat([crop, self.blstats_fc(obs_dict["blstats"])], dim=1)

    def get_out_size(self) -> int:
        return self.out_size


def make_encoder(cfg: Any, obs_space: gym.spaces.Dict) -> NetHackEncoder:
    return NetHackEncoder(cfg, obs_space)


def register_components() -> None:
    from sample_factory.algo.utils.context import global_model_factory
    from sample_factory.envs.env_utils import register_env

    register_env(ENV_NAME, make_nethack_env)
    global_model_factory().register_encoder_factory(make_encoder)


# -- checkpoints and trained policies ------------------------------------------------------------------------
def load_checkpoint(path: str | Path) -> dict:
    """A sample-factory checkpoint, through torch's weights-only unpickler. Besides tensors, ints and floats it holds
    ``best_performance``, a numpy float64 once the learner has recorded a best (after its first episodes' stats: a
    long run's checkpoints, not a toy run's); the numpy scalar's globals are allowed, nothing else is."""
    scalar = np.float64(0).__reduce__()[0]  # the function a numpy scalar pickles with (numpy._core on NumPy 2)
    allowed = [scalar, np.dtype, type(np.dtype(np.float64))]
    with torch.serialization.safe_globals(allowed):
        return torch.load(path, map_location="cpu", weights_only=True)


def latest_checkpoint(experiment_dir: str | Path) -> tuple[Path, int] | None:
    """(path, env_steps) of the newest sample-factory checkpoint of an experiment, or None."""
    files = sorted(glob.glob(os.path.join(experiment_dir, "checkpoint_p0", "checkpoint_*.pth")))
    if not files:
        return None
    match = re.search(r"checkpoint_\d+_(\d+)\.pth$", files[-1])
    return Path(files[-1]), int(match.group(1)) if match else 0


def num_actions(extended_actions: bool) -> int:
    return len(EXTENDED_ACTIONS if extended_actions else TASK_ACTIONS)


class TrainedPolicy:
    """A sample-factory checkpoint acting on raw NLE observations of a batch of envs (rollout and evaluate)."""

    def __init__(self, experiment_dir: str | Path, deterministic: bool = False) -> None:
        from sample_factory.model.actor_critic import create_actor_critic
        from sample_factory.utils.attr_dict import AttrDict

        experiment_dir = Path(experiment_dir)
        register_components()
        self.cfg = AttrDict(json.loads((experiment_dir / "config.json").read_text()))
        found = latest_checkpoint(experiment_dir)
        if found is None:
            raise FileNotFoundError(f"{experiment_dir}: no sample-factory checkpoint")
        self.checkpoint, self.env_steps = found
        self.view = PolicyView(self.cfg.crop_size)
        action_space = gym.spaces.Discrete(num_actions(self.cfg.nethack_extended_actions))
        self.model = create_actor_critic(self.cfg, self.view.space, action_space)
        state = load_checkpoint(self.checkpoint)
        self.model.load_state_dict(state["model"])
        self.model.eval()
        self.deterministic = deterministic

    def initial_state(self, n: int) -> torch.Tensor:
        from sample_factory.model.model_utils import get_rnn_size

        return torch.zeros(n, get_rnn_size(self.cfg))

    @torch.no_grad()
    def act(self, observations: list[dict], rnn_states: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
        """Actions for a batch of raw NLE observations, and the next recurrent states."""
        from sample_factory.algo.utils.action_distributions import argmax_actions
        from sample_factory.algo.utils.rl_utils import prepare_and_normalize_obs

        views = [self.view(o) for o in observations]
        batch = {k: torch.from_numpy(np.stack([v[k] for v in views])) for k in views[0]}
        out = self.model(prepare_and_normalize_obs(self.model, batch), rnn_states)
        actions = argmax_actions(self.model.action_distribution()) if self.deterministic else out["actions"]
        return actions.reshape(-1).numpy(), out["new_rnn_states"]


# -- training entry point ------------------------------------------------------------------------------------
SUMMARY = "curio_summary.json"
CURVE = "curio_curve.json"  # [{env_steps, return}] over training, for the rl-nethack learning-curve plot


def _summary_observer(path: Path, resumed_from: int, per_iteration: bool = False):
    """An AlgoObserver writing what the rl stage reports: env steps, FPS of this run, episode statistics.

    The learning curve gets a point per summary interval (seconds), or with ``per_iteration`` (deterministic
    training) one per training iteration, so that two runs give the same curve."""
    import time

    from sample_factory.algo.runners.runner import AlgoObserver

    curve_path = path.with_name(CURVE)

    class TrainingSummary(AlgoObserver):
        def on_start(self, runner) -> None:
            self.start = time.time()
            # The learning curve continues across resumes (the experiment dir is cleared when settings change).
            self.curve = json.loads(curve_path.read_text()) if curve_path.exists() else []

        def add_point(self, runner) -> None:
            """Mean task return (true objective) of the recent episodes at these env steps (sample-factory's own
            tensorboard tags appear only once 100 episodes have finished)."""
            recent = runner.policy_avg_stats.get("true_objective", {})
            steps = int(runner.env_steps[0])
            if recent and len(recent[0]) and (not self.curve or self.curve[-1]["env_steps"] < steps):
                self.curve.append({"env_steps": steps, "return": float(np.mean(recent[0]))})

        def extra_summaries(self, runner, policy_id, *_) -> None:
            if policy_id == 0 and not per_iteration:
                self.add_point(runner)

        def on_training_step(self, runner, training_iteration_since_resume: int) -> None:
            if per_iteration:
                self.add_point(runner)

        def on_stop(self, runner) -> None:
            atomic_write_json(curve_path, getattr(self, "curve", []))
            seconds = time.time() - getattr(self, "start", time.time())
            steps = runner.total_env_steps_since_resume or 0
            stats = {k: float(np.mean(v[0])) for k, v in runner.policy_avg_stats.items() if len(v[0])}
            atomic_write_json(path, {
                "env_steps": int(sum(runner.env_steps.values())),
                "resumed_from_env_steps": resumed_from,
                "env_steps_this_run": int(steps),
                "seconds_this_run": round(seconds, 2),
                "fps": round(steps / seconds, 1) if seconds > 0 else 0.0,
                "episode_stats": stats,
            })

    return TrainingSummary()


PROGRESS_COLUMNS = (
    "env_steps", "seconds", "seen", "labels", "pending", "helpful_share", "labels_per_s", "heldout_accuracy",
    "errors", "annotator_restarts", "llm_requests", "llm_cache_hits", "llm_sent", "llm_failures", "llm_unknowns",
    "llm_tokens_in", "llm_tokens_out", "llm_latency_p50_s", "cpu_s", "cpu_label_s", "cpu_fit_s", "cpu_publish_s",
)


def _online_annotation(cfg: Any, every_s: float = 5.0):
    """An AlgoObserver that runs the ONI annotator beside training: started with the runner, restarted if it
    dies, stopped with it; every ``every_s`` it appends the annotator's status with the env steps to
    ``oni/progress.csv`` (labels/s, queue length, share helpful, held-back accuracy, LLM ledger)."""
    import csv
    import subprocess
    import time

    from sample_factory.algo.runners.runner import AlgoObserver

    directory = oni_directory(cfg)
    # the workers flush their spools and re-read the table every oni_refresh_s: the annotator looks and publishes
    # at that pace (a long queue is labelled batch after batch in between)
    settings = {"poll_s": cfg.oni_refresh_s, "publish_s": cfg.oni_refresh_s, **json.loads(cfg.oni_config),
                "reward": cfg.intrinsic_reward, "seed": cfg.seed or 0}

    class OnlineAnnotation(AlgoObserver):
        proc: subprocess.Popen | None = None
        restarts = 0
        last = 0.0
        columns: list[str] | tuple[str, ...] | None = None  # the progress file's columns (its header, once it exists)

        def _launch(self) -> None:
            # the shared annotator process (pipeline.llm.online_annotation) with NetHack's labeller and model
            self.proc = online_annotation.launch(directory, oni.FACTORY, settings)

        def on_init(self, runner) -> None:
            # Before sample-factory starts its workers: the annotator's imports and model loading overlap theirs.
            self.start = time.time()
            self._launch()

        def on_training_step(self, runner, training_iteration_since_resume: int) -> None:
            now = time.time()
            if now - self.last < every_s:
                return
            self.last = now
            if self.proc is not None and self.proc.poll() is not None:
                self.restarts += 1  # a crashed annotator costs labels, never training
                self._launch()
            self.record(int(sum(runner.env_steps.values())))

        def record(self, env_steps: int) -> None:
            try:
                status = json.loads((directory / oni.STATUS).read_text())
            except (OSError, ValueError):
                return
            row = {**status, "env_steps": env_steps, "seconds": round(time.time() - self.start, 1),
                   "annotator_restarts": self.restarts}
            path = directory / oni.PROGRESS
            new = not path.exists() or path.stat().st_size == 0
            if new:
                self.columns = PROGRESS_COLUMNS
            elif self.columns is None:  # read once: a run resumed from an older version keeps its file's columns
                with open(path, newline="") as f:
                    self.columns = next(csv.reader(f), None) or PROGRESS_COLUMNS
            with open(path, "a", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
                if new:
                    writer.writeheader()
                writer.writerow(row)

        def on_stop(self, runner) -> None:
            if self.proc is None:
                return
            online_annotation.stop(self.proc)  # it finishes its batch's bookkeeping; the queue is on disk
            self.record(int(sum(runner.env_steps.values())))

    return OnlineAnnotation()


def main(argv: list[str] | None = None) -> int:
    from sample_factory.algo.utils.misc import ExperimentStatus
    from sample_factory.train import make_runner

    # sample-factory's serial runner leaves torch at one thread per core; with the cores shared (env stepping,
    # other processes) OpenMP's spinning threads cost more than they give, so use one.
    torch.set_num_threads(1)
    grace_s = grace_from_env()
    stop = StopRequest(grace_s)
    stop.install()
    start_shm_manager()
    watch_parent(grace_s or 45.0)
    register_components()
    cfg = parse_cfg(sys.argv[1:] if argv is None else argv)
    if cfg.nethack_deterministic:
        if not cfg.serial_mode or cfg.async_rl or cfg.seed is None:
            raise SystemExit("--nethack_deterministic needs --serial_mode=True --async_rl=False and a --seed")
        torch.use_deterministic_algorithms(True)
    experiment_dir = Path(cfg.train_dir) / cfg.experiment
    found = latest_checkpoint(experiment_dir)
    cfg, runner = make_runner(cfg)
    runner.register_observer(stop.observer())
    runner.register_observer(_summary_observer(experiment_dir / SUMMARY, found[1] if found else 0,
                                               per_iteration=cfg.nethack_deterministic))
    if cfg.intrinsic_reward in ONLINE_REWARDS and cfg.int_coef != 0:
        runner.register_observer(_online_annotation(cfg))
    status = runner.init()
    if status == ExperimentStatus.SUCCESS:
        status = runner.run()
    return STOPPED_EXIT if stop.signum is not None and status == ExperimentStatus.SUCCESS else status
