"""rollout-nethack: NLE episodes from a random policy or a sample-factory checkpoint, one row per step.

Output: ``data/rollout_nethack`` — chunked Parquet (``pipeline.nethack.play.FRAME_STEP_SCHEMA``): episode, step,
action, task reward, the decoded game message, the bottom-line stats and the terminal (``tty_chars``, 24 x 80
characters, what the report's replay page draws) of every observation (step 0 = the observation after reset). A
chunk is ``episodes_per_chunk`` episodes, each seeded from (seed, stage, episode), so a killed run resumes at the
first missing chunk with exactly the rows an uninterrupted run would write.

    curio stage rollout-nethack -S rollout_nethack.episodes=8
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.core.artifacts import chunk_seed, file_sha256, read_table
from pipeline.core.runners import run_chunked
from pipeline.core.stage import Out, Stage, StageContext, StageResult
from pipeline.nethack.play import FRAME_STEP_SCHEMA, EnvSpec, StepRecorder, play_policy, play_random
from pipeline.params import Params

NAME = "rollout-nethack"
METRIC_HELP = {
    "episodes": "episodes that ended",
    "steps": "environment steps played",
    "mean_episode_length": "mean steps of an episode",
    "mean_return": "mean in-game return of an episode",
    "message_fraction": "share of the steps that show a message",
    "unique_messages": "distinct messages seen",
}

STAGE = Stage(
    NAME,
    params=["seed", "nethack", "rollout_nethack"],
    code=["pipeline/nethack/play.py", "pipeline/nethack/env.py", "pipeline/nethack/clock.py",
          "pipeline/nethack/clock.c"],
    outs=[Out("data/rollout_nethack", persist=True)],
    track="nethack",
    metric_help=METRIC_HELP,
)


def episode_seeds(seed: int, episodes: list[int]) -> list[int]:
    return [chunk_seed(seed, NAME, e) for e in episodes]


def collect_chunk(params: Params, index: int, policy: Any = None) -> StepRecorder:
    """Play the episodes of chunk ``index`` and record every step."""
    cfg = params.rollout_nethack
    first = index * cfg.episodes_per_chunk
    episodes = list(range(first, min(first + cfg.episodes_per_chunk, cfg.episodes)))
    spec = EnvSpec(cfg.task, cfg.extended_actions, cfg.max_episode_steps, frames=True, clock=params.nethack.clock)
    recorder = StepRecorder(frames=True)
    seeds = episode_seeds(params.seed, episodes)
    if policy is None:
        play_random(spec, episodes, seeds, on_step=recorder.add)
    else:
        import torch

        torch.manual_seed(chunk_seed(params.seed, NAME, -1 - index))  # sampled actions reproducible per chunk
        play_policy(spec, policy, episodes, seeds, on_step=recorder.add)
    return recorder


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.rollout_nethack
    out = params.data_path("rollout_nethack")
    policy = None
    upstream: dict[str, str] = {}
    if cfg.policy == "checkpoint":
        from pipeline.nethack.sf import TrainedPolicy  # sample-factory: only for a trained agent

        policy = TrainedPolicy(cfg.checkpoint)
        upstream["checkpoint"] = file_sha256(policy.checkpoint)
    num_chunks = -(-cfg.episodes // cfg.episodes_per_chunk)
    run_chunked(
        out,
        num_chunks=num_chunks,
        make_chunk=lambda i: collect_chunk(params, i, policy).table(),
        params_hash=params.section_hash(STAGE.params),
        upstream=upstream,
        schema=FRAME_STEP_SCHEMA,
        desc="rollout-nethack chunks",
    )
    table = read_table(out, ["episode", "reward", "message", "done"])
    messages = table["message"].to_numpy(zero_copy_only=False)
    done = table["done"].to_numpy()
    returns = np.bincount(table["episode"].to_numpy(), weights=table["reward"].to_numpy())
    lengths = np.bincount(table["episode"].to_numpy()) - 1  # minus the reset row
    return StageResult(
        metrics={
            "episodes": int(done.sum()),
            "steps": int(len(done) - len(lengths)),
            "mean_episode_length": float(lengths.mean()),
            "mean_return": float(returns.mean()),
            "message_fraction": float(np.mean(messages != "")),
            "unique_messages": int(len(set(messages.tolist()))),
        },
        outputs=[str(out)],
    )
