"""rl-text, ``rl_text.algorithm: filtered_bc``: online filtered behaviour cloning (the ArCHer paper's "Online
Filtered BC" baseline).

Each round: the current policy plays ``tasks_per_round`` train tasks × k; all trajectories so far are ranked
(success first, then fewer turns); the top ``top_quantile`` fraction is cloned (assistant-only SFT) into the
current policy. With a dense ``rl_text.reward`` (judge, motif, oni) the ranking is by the mean of a trajectory's
per-utterance rewards instead (highest first, ties in play order; stored in the round's rollouts as
``turn_rewards``): the mean, not the sum, because a judge's reward is mostly positive, so a sum would rank long,
failed conversations above short wins. Format-invalid trajectories are never cloned, with either reward. With
``rl_text.curriculum.enabled`` the round's tasks are the curriculum's picks (pipeline/rl_text/rounds.py).

Rollouts are one Parquet part per round and the policy is saved after every round, so a killed run resumes at
the first unfinished round. On SIGTERM it stops once the round's rollouts are written, or with a checkpoint of
the round's cloning at the step it is on (``pipeline.models.training``), or after the round.
Output: ``data/rl_text/model`` (+ rounds, rollouts).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pyarrow as pa

from pipeline.core import interrupt
from pipeline.core.artifacts import (
    ChunkedDataset,
    atomic_write_bytes,
    atomic_write_json,
    chunk_seed,
    dir_hash,
    read_part,
    read_rows,
)
from pipeline.core.checkpoints import keyed_dir, run_key
from pipeline.core.stage import StageContext, StageResult
from pipeline.llm import sampling_from_config
from pipeline.llm.hf import load_policy
from pipeline.models import tiny
from pipeline.models.training import sft_train
from pipeline.params import Params
from pipeline.rl_text.rounds import (
    NAME,
    curriculum_metrics,
    episode_jobs,
    online_curriculum,
    params_key,
    round_episodes,
    train_jobs,
)
from pipeline.rl_text.serving import PolicyPlayer
from pipeline.text.play import EPISODE_SCHEMA, play_episodes, summarize
from pipeline.text.policies import make_games, require_policy
from pipeline.text.turn_rewards import TurnRewards, make_turn_rewards

#: What it writes under data/rl_text besides model/ (stages/rl_text.py removes another algorithm's).
OUTPUTS = frozenset({"rollouts", "rounds", "checkpoints"})

JUDGED_SCHEMA = EPISODE_SCHEMA.append(pa.field("turn_rewards", pa.list_(pa.float64())))


def top_fraction(rows: list[dict], fraction: float) -> list[dict]:
    """The best ``fraction`` of trajectories: successes first, then fewer turns (ties keep input order)."""
    valid = [r for r in rows if not r["invalid"]]
    ranked = sorted(valid, key=lambda r: (not r["success"], r["turns"]))
    return ranked[: max(1, math.ceil(fraction * len(valid)))] if valid else []


def top_by_turn_reward(rows: list[dict], fraction: float) -> list[dict]:
    """The best ``fraction`` of trajectories by the mean of their per-utterance rewards (``turn_rewards``),
    highest first (ties keep input order); format-invalid ones are left out."""
    valid = [r for r in rows if not r["invalid"]]
    ranked = sorted(valid, key=lambda r: -mean_reward(r["turn_rewards"]))
    return ranked[: max(1, math.ceil(fraction * len(valid)))] if valid else []


def mean_reward(rewards: list[float]) -> float:
    return sum(rewards) / len(rewards) if rewards else 0.0


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.rl_text
    lora = params.train_policy.lora if cfg.lora else None
    out = params.data_path("rl_text")
    init = require_policy(params, "dpo")
    key, init_hash = params_key(params), dir_hash(init)
    rollouts = ChunkedDataset(out / "rollouts", params_hash=key, upstream={"init": init_hash})
    # Round models and SFT checkpoints of other params or another init are stale: never resumed.
    rounds_dir = keyed_dir(out / "rounds", run_key(key, init_hash))
    checkpoints = keyed_dir(out / "checkpoints", run_key(key, init_hash))
    games = make_games(params)
    jobs = train_jobs(params, games)
    sampling = sampling_from_config(params.rollout_text)
    curriculum = online_curriculum(params, jobs, lambda i: read_part(rollouts.path, i))
    rewarder = make_turn_rewards(params, key)
    player = PolicyPlayer(params)  # the configured backend; on vLLM, the run's one server
    current = Path(init)
    try:
        for r in range(cfg.rounds):
            round_dir = rounds_dir / f"round-{r:03d}"
            if (round_dir / "DONE").exists() and r in rollouts.finished():
                current = round_dir
                continue
            current = play_and_clone(params, ctx, r, current, round_dir, rollouts, checkpoints, jobs, games,
                                     sampling, curriculum, rewarder, lora, player)
            if r + 1 < cfg.rounds:
                interrupt.check()  # the round is saved: the next one starts the rerun
    finally:
        player.close()
        if rewarder is not None:
            rewarder.close()
    final = out / "model"
    if final.exists():
        shutil.rmtree(final)
    shutil.copytree(current, final)
    shutil.rmtree(checkpoints)  # finished: no checkpoint left in the DVC output
    rollouts.mark_complete(cfg.rounds)
    rows = read_rows(out / "rollouts", ["success", "invalid", "turns", "score"]) if cfg.rounds else []
    history, episodes = [], 0
    for r in range(cfg.rounds):
        part = read_part(rollouts.path, r)
        episodes += len(part)
        history.append({"round": r, **summarize(part), "episodes": episodes, "algorithm": cfg.algorithm})
    atomic_write_json(params.plots_path("rl_rounds.json"), history)
    metrics = {f"rollouts/{k}": v for k, v in summarize(rows).items()}
    metrics.update(curriculum_metrics(params, curriculum))
    if rewarder is not None and cfg.rounds:
        judged = read_rows(out / "rollouts", ["turn_rewards"])
        metrics["rl/mean_turn_reward"] = mean_reward([x for r in judged for x in r["turn_rewards"]])
        metrics.update(rewarder.metrics())
    metrics.update(player.metrics())  # vllm: the server starts of this run (1 for a LoRA run not interrupted)
    return StageResult(metrics=metrics, outputs=[str(final)])


def play_and_clone(params: Params, ctx: StageContext, r: int, current: Path, round_dir: Path,
                   rollouts: ChunkedDataset, checkpoints: Path, jobs, games, sampling, curriculum,
                   rewarder: TurnRewards | None, lora, player: PolicyPlayer) -> Path:
    """Round ``r``: play (unless its rollouts are on disk), clone the best so far, save; returns the round's model."""
    cfg = params.rl_text
    with interrupt.at(f"round {r + 1} of {cfg.rounds}") as point:
        model, tokenizer = load_policy(current, params.policy.device)
        seed = chunk_seed(params.seed, NAME, r)
        if r not in rollouts.finished():
            policy = player.backend(current, model, tokenizer)  # on vLLM: the run's server, the round's weights
            episodes = episode_jobs(jobs, round_episodes(params, jobs, r, curriculum))
            rows = play_episodes(policy, episodes, sampling, seed=seed, policy_name=f"rl-round-{r}",
                                 max_format_retries=params.rollout_text.max_format_retries)
            schema = EPISODE_SCHEMA
            if rewarder is not None:
                rewards = rewarder(policy, tokenizer, games, rows, chunk_seed(params.seed, f"{NAME}/judge", r), r)
                rows = [{**row, "turn_rewards": got} for row, got in zip(rows, rewards, strict=True)]
                schema = JUDGED_SCHEMA
            rollouts.write_part(r, rows, schema)
            point.text += " (its episodes played)"  # kept: the rerun clones them
            interrupt.check()
        so_far = [row for i in sorted(rollouts.finished()) if i <= r
                  for row in read_part(rollouts.path, i)]
        keep = top_fraction(so_far, cfg.top_quantile) if rewarder is None else top_by_turn_reward(
            so_far, cfg.top_quantile)
        if keep:  # every trajectory so far invalid: nothing to clone, the policy carries over unchanged
            model, _, _ = sft_train(
                model, tokenizer, [k["conversation"] for k in keep], checkpoints / f"round-{r:03d}",
                lr=cfg.lr, epochs=cfg.epochs, batch_size=cfg.batch_size, seed=seed, tracker=ctx.tracker,
                prefix=f"rl_round_{r}", lora=lora,
            )
        stats = summarize(read_part(rollouts.path, r))
        ctx.tracker.log_metrics({"rl/success_rate": stats["success_rate"], "rl/kept": len(keep)}, step=r)
        tiny.save(model, tokenizer, round_dir)
        atomic_write_bytes(round_dir / "DONE", b"ok")  # whole or absent, even on a full disk
        shutil.rmtree(checkpoints / f"round-{r:03d}", ignore_errors=True)  # the round's model is saved
    return round_dir

