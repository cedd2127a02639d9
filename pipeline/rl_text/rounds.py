"""What rl-text's round-based algorithms share (grpo, filtered_bc): the stage's name and params, each round's tasks,
and the round loop itself (:func:`run_rounds`).

Each round: the current policy plays ``tasks_per_round`` train tasks × ``trajectories_per_task`` on the configured
backend (:class:`~pipeline.rl_text.serving.PolicyPlayer`), sampling as ``rl_text.sampling`` says; the dense
``rl_text.reward`` is computed once and stored with the round's episodes (one Parquet part per round); the
algorithm learns (its ``learn``, the only thing an algorithm file keeps); the round's model is saved and, with val
tasks, played on them at the evaluation temperature. The model kept is the val-best round, the DPO policy counting
as round 0 (early stopping on val: the number of rounds is chosen on val, never on held-out tasks); without val
(``games.val_fraction`` 0 or ``rl_text.val_trajectories`` 0) the last round, and ``rl/kept_by_val`` says 0.

Each round's tasks are a uniform sample of the train tasks (seeded by the round), or with
``rl_text.curriculum.enabled`` the picks of PAPRIKA's UCB curriculum updated by the learning potential of the
policy's own episodes of the rounds before (``pipeline.text.curriculum.OnlineCurriculum``, rebuilt from the
rounds' rows on disk: a resumed run picks what an uninterrupted one does).

A killed run resumes at the first unfinished round: a round's rollouts are kept once written (its rerun learns from
them), and a round is finished once its model, val result and ``DONE`` are saved. On SIGTERM it stops once the
round's rollouts are written, inside the learning step where the algorithm checks, or after the round.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from pipeline.core import interrupt
from pipeline.core.artifacts import (
    ChunkedDataset,
    atomic_write_bytes,
    atomic_write_json,
    chunk_seed,
    dir_hash,
    read_part,
)
from pipeline.core.checkpoints import keyed_dir, run_key
from pipeline.core.stage import StageContext, StageResult
from pipeline.llm import sampling_from_config
from pipeline.llm.base import ChatBackend, Sampling
from pipeline.llm.hf import load_policy
from pipeline.models import tiny
from pipeline.params import Params
from pipeline.rl_text.serving import PolicyPlayer
from pipeline.text.config import GamesConfig, RLSamplingConfig, RLTextConfig
from pipeline.text.play import play_episodes, summarize
from pipeline.text.policies import game_tasks, make_games, require_policy
from pipeline.text.turn_rewards import make_turn_rewards

if TYPE_CHECKING:
    from pipeline.envs.base import Game, Task
    from pipeline.text.curriculum import OnlineCurriculum

NAME = "rl-text"
#: The params rl-text reads (its STAGE declaration's): each algorithm keys its resumable state by their hash.
PARAMS = [
    "seed", "policy", "games.groups", "games.max_train_tasks", "games.val_fraction", "rollout_text", "rl_text",
    "train_policy.lora",  # the adapters of rl_text.lora
    "evaluate_text.temperature", "eval_seed",  # the val rounds sample as evaluation does
]


def params_key(params: Params) -> str:
    """The hash of rl-text's params: what the algorithms' and the rewards' state on disk is keyed by."""
    return params.section_hash(PARAMS)


def online_curriculum(cfg: RLTextConfig, seed: int, jobs: list[tuple[Game, Task]],
                      rows_of: Callable[[int], list[dict]]) -> OnlineCurriculum | None:
    """The curriculum that picks each round's tasks (None: ``rl_text.curriculum.enabled`` is off), from the
    ``rl_text`` params section and the training ``seed``; ``rows_of`` gives a finished round's episode rows
    (``group``, ``task_id``, ``sample``, ``score``)."""
    from pipeline.text.curriculum import OnlineCurriculum, task_key

    if not cfg.curriculum.enabled:
        return None
    by_group = cfg.curriculum.arms == "group_difficulty"
    arm_of = {task_key(g.name, t.task_id): f"{g.name}/{t.difficulty}" if by_group else t.difficulty for g, t in jobs}
    return OnlineCurriculum(arm_of, cfg.curriculum.alpha, cfg.tasks_per_round, cfg.trajectories_per_task,
                            rng_of=lambda i: random.Random(chunk_seed(seed, f"{NAME}/curriculum", i)),
                            rows_of=rows_of)


def round_episodes(cfg: RLTextConfig, seed: int, jobs: list[tuple[Game, Task]], r: int,
                   curriculum: OnlineCurriculum | None) -> list[tuple[str, int]]:
    """Round ``r``'s episodes as (task key, sample): the curriculum's picks, or a uniform sample of ``jobs`` as the
    ``rl_text`` params section sizes it, drawn from the training ``seed``."""
    from pipeline.text.curriculum import task_key

    if curriculum is not None:
        return curriculum.episodes(r)
    picked = random.Random(chunk_seed(seed, NAME, r)).sample(jobs, min(cfg.tasks_per_round, len(jobs)))
    return [(task_key(g.name, t.task_id), s) for g, t in picked for s in range(cfg.trajectories_per_task)]


def train_jobs(games_cfg: GamesConfig, cap: int | None, games: list[Game]) -> list[tuple[Game, Task]]:
    """The train tasks the rounds draw from: ``cap`` per group (``rl_text.max_train_tasks``; null: the ``games``
    params section's ``max_train_tasks``, the tasks rollout-text played)."""
    return [(g, t) for g in games for t in game_tasks(games_cfg, g, "train", cap=cap)]


def episode_jobs(jobs: list[tuple[Game, Task]], keys: list[tuple[str, int]]) -> list[tuple[Game, Task, int]]:
    from pipeline.text.curriculum import task_key

    task_of = {task_key(g.name, t.task_id): (g, t) for g, t in jobs}
    return [(*task_of[key], s) for key, s in keys]


def curriculum_metrics(cfg: RLTextConfig, curriculum: OnlineCurriculum | None) -> dict[str, float]:
    """Pulls and mean learning potential per arm after the last round (``rl_text.rounds``)."""
    if curriculum is None:
        return {}
    c = curriculum.state_before(cfg.rounds)
    out: dict[str, float] = {}
    for arm in c.arms:
        out[f"curriculum/{arm}/pulls"] = c.pulls[arm]
        out[f"curriculum/{arm}/mean_potential"] = c.mean_potential(arm)
    return out


def round_sampling(cfg: RLSamplingConfig, max_new_tokens: int) -> Sampling:
    """How the rounds sample the policy: ``rl_text.sampling`` (its own truncation, the model's generation config
    adding none), ``max_new_tokens`` per reply (``rollout_text.max_new_tokens``)."""
    return Sampling(temperature=cfg.temperature, top_p=cfg.top_p, min_p=cfg.min_p, top_k=cfg.top_k,
                    max_tokens=max_new_tokens)


def val_jobs_of(games_cfg: GamesConfig, cfg: RLTextConfig, games: list[Game]) -> list[tuple[Game, Task]]:
    """The (game, task) pairs of the val rounds, from the ``games`` and ``rl_text`` params sections: every val task,
    or ``rl_text.max_val_tasks`` per group (never evaluation's ``games.max_eval_tasks``, which training stages do not
    watch); none without a val split."""
    if games_cfg.val_fraction == 0 or cfg.val_trajectories == 0:
        return []
    cap = cfg.max_val_tasks or 0
    return [(g, t) for g in games for t in game_tasks(games_cfg, g, "val", cap=cap)]


def val_success(params: Params, policy: ChatBackend, val_jobs) -> float | None:
    """Success rate of the policy on the val tasks (the same seed every round, and for every training seed:
    rounds and runs compare paired); None without val."""
    if not val_jobs:
        return None
    jobs = [(g, t, s) for g, t in val_jobs for s in range(params.rl_text.val_trajectories)]
    sampling = sampling_from_config(params.rollout_text, temperature=params.evaluate_text.temperature)
    rows = play_episodes(policy, jobs, sampling, seed=chunk_seed(params.eval_seed, f"{NAME}/val", 0),
                         max_format_retries=params.rollout_text.max_format_retries, policy_name="val")
    return summarize(rows)["success_rate"]


class Learner(Protocol):
    """One round-based algorithm: what it stores of a round, and its learning step."""

    #: what it writes under data/rl_text besides model/ (stages/rl_text.py removes another algorithm's)
    outputs: frozenset[str]
    token_ids: bool  #: whether the rounds play token in, token out (the sampler's ids and log-probs kept)

    def schema(self, dense: bool) -> pa.Schema:
        """The rows of a round's part (``dense``: with a dense reward's ``turn_rewards``)."""
        ...

    def learn(self, state: Round, model, tokenizer) -> tuple[object, dict]:
        """The round's update of ``model``; the updated model and the stats to log."""
        ...


@dataclass
class Round:
    """What a learner's step may read of round ``index``: its episodes (and every round's before), its seed, its
    scratch directory (checkpoints within the step, removed once the round is saved)."""

    params: Params
    ctx: StageContext
    index: int
    rollouts: ChunkedDataset
    games: dict
    seed: int
    scratch: Path
    rewarded: bool  #: a dense rl_text.reward's turn_rewards are in the rows

    def rows(self) -> list[dict]:
        return read_part(self.rollouts.path, self.index)

    def rows_so_far(self) -> list[dict]:
        return [row for i in sorted(self.rollouts.finished()) if i <= self.index
                for row in read_part(self.rollouts.path, i)]


def run_rounds(params: Params, ctx: StageContext, learner: Learner, name: str) -> StageResult:
    """rl-text's rounds for ``learner``: play, reward, write, learn, save, val; then the model kept and the metrics."""
    cfg = params.rl_text
    out = params.data_path("rl_text")
    init = require_policy(params, "dpo")
    key, init_hash = params_key(params), dir_hash(init)
    rollouts = ChunkedDataset(out / "rollouts", params_hash=key, upstream={"init": init_hash})
    # round models and checkpoints of other params or another init are stale: never resumed
    rounds_dir = keyed_dir(out / "rounds", run_key(key, init_hash))
    game_list = make_games(params, params.rl_text.groups)
    games = {g.name: g for g in game_list}
    jobs = train_jobs(params.games, cfg.max_train_tasks, game_list)
    val_jobs = val_jobs_of(params.games, cfg, game_list)
    curriculum = online_curriculum(cfg, params.seed, jobs, lambda i: read_part(rollouts.path, i))
    rewarder = make_turn_rewards(params, key)
    scratch = keyed_dir(out / "checkpoints", run_key(key, init_hash)) if "checkpoints" in learner.outputs else None
    # the configured backend; on vLLM, the run's one server
    player = PolicyPlayer(params.policy, params.rollout_text.batch_size)
    start = rounds_dir / "round-start"  # the DPO policy's own val result: round 0 of the early stopping
    current, episodes, history, timings = Path(init), 0, [], {}
    try:
        if not (start / "val.json").exists():
            start.mkdir(parents=True, exist_ok=True)
            score = None
            if val_jobs:
                model, tokenizer = load_policy(init, params.policy.device)
                score = val_success(params, player.backend(current, model, tokenizer), val_jobs)
            atomic_write_json(start / "val.json", {"val_success": score})
        candidates = [(json.loads((start / "val.json").read_text())["val_success"], -1, Path(init))]
        for r in range(cfg.rounds):
            round_dir = rounds_dir / f"round-{r:03d}"
            if not ((round_dir / "DONE").exists() and r in rollouts.finished()):
                state = Round(params, ctx, r, rollouts, games, chunk_seed(params.seed, NAME, r),
                              (scratch or rounds_dir) / f"round-{r:03d}-scratch", rewarder is not None)
                play_and_learn(state, learner, current, round_dir, jobs, val_jobs, curriculum, rewarder, player,
                               timings)
            current = round_dir
            result = json.loads((round_dir / "val.json").read_text())
            part = read_part(rollouts.path, r)
            episodes += len(part)
            history.append({"round": r, **summarize(part), "episodes": episodes, "algorithm": name,
                            "val_success": result["val_success"], **result["stats"]})
            candidates.append((result["val_success"], r, round_dir))
            if r + 1 < cfg.rounds:
                interrupt.check()  # the round is saved: the next one starts the rerun
    finally:
        player.close()
        if rewarder is not None:
            rewarder.close()
    rollouts.mark_complete(cfg.rounds)
    by_val = bool(val_jobs)
    # early stopping on val: the best round (ties: the earliest), the DPO policy as round 0; without val the last
    best = max(candidates, key=lambda c: (c[0], -c[1])) if by_val else candidates[-1]
    final = out / "model"
    if final.exists():
        shutil.rmtree(final)
    shutil.copytree(best[2], final, ignore=shutil.ignore_patterns("DONE", "val.json"))
    if scratch is not None:
        shutil.rmtree(scratch)  # finished: no checkpoint left in the DVC output
    atomic_write_json(params.plots_path("rl_rounds.json"), history)
    rows = [row for r in range(cfg.rounds) if r in rollouts.finished() for row in read_part(rollouts.path, r)]
    metrics = {f"rollouts/{k}": v for k, v in summarize(rows).items()} if rows else {}
    metrics.update(curriculum_metrics(cfg, curriculum))
    metrics.update({"rl/chosen_round": best[1] + 1, "rl/kept_by_val": int(by_val)})
    if by_val:
        metrics.update({"rl/val_success_start": candidates[0][0], "rl/val_success_chosen": best[0]})
    if rewarder is not None:
        dense = [x for row in rows for x in row.get("turn_rewards") or []]
        if dense:
            metrics["rl/mean_turn_reward"] = sum(dense) / len(dense)
        metrics.update(rewarder.metrics())
    metrics.update(timings)  # the learning steps' seconds (KEY_total_s), summed over the rounds this process ran
    metrics.update(player.metrics())  # vllm: the server starts of this run (1 for a run not interrupted)
    return StageResult(metrics=metrics, outputs=[str(final)])


def play_and_learn(state: Round, learner: Learner, current: Path, round_dir: Path, jobs, val_jobs, curriculum,
                   rewarder, player, timings: dict[str, float]) -> None:
    """Round ``state.index``: play (unless its rollouts are on disk), learn, save the model and its val result."""
    params, r, rollouts = state.params, state.index, state.rollouts
    with interrupt.at(f"round {r + 1} of {params.rl_text.rounds}") as point:
        model, tokenizer = load_policy(current, params.policy.device)
        if r not in rollouts.finished():
            policy = player.backend(current, model, tokenizer)  # on vLLM: the run's server, the round's weights
            played = episode_jobs(jobs, round_episodes(params.rl_text, params.seed, jobs, r, curriculum))
            sampling = round_sampling(params.rl_text.sampling, params.rollout_text.max_new_tokens)
            rows = play_episodes(policy, played, sampling, seed=state.seed,
                                 policy_name=f"rl-round-{r}", token_ids=learner.token_ids,
                                 max_format_retries=params.rollout_text.max_format_retries)
            if rewarder is not None:
                dense = rewarder(policy, tokenizer, list(state.games.values()), rows,
                                 chunk_seed(params.seed, f"{NAME}/judge", r), r)
                rows = [{**row, "turn_rewards": d} for row, d in zip(rows, dense, strict=True)]
            rollouts.write_part(r, rows, learner.schema(rewarder is not None))
            point.text += " (its episodes played)"  # kept: the rerun learns from them
            interrupt.check()
        model, stats = learner.learn(state, model, tokenizer)
        model.eval()
        tiny.save(model, tokenizer, round_dir)  # before its val pass: a vLLM server loads the round from here
        score = val_success(params, player.backend(round_dir, model, tokenizer), val_jobs) if val_jobs else None
        state.ctx.tracker.log_metrics({k: v for k, v in {**stats, "rl/val_success": score}.items()
                                       if isinstance(v, int | float)}, step=r)
        # seconds: to the tracker at this round's step and to this run's totals, named KEY_total_s (the stage's
        # metrics land on MLflow's step 0, where the same key would hide round 0's); not to val.json, so that what
        # the round saves is the same on any rerun
        for k in [k for k in stats if k.endswith("_s")]:
            total = k.removesuffix("_s") + "_total_s"
            timings[total] = timings.get(total, 0.0) + stats.pop(k)
        atomic_write_json(round_dir / "val.json", {"val_success": score, "stats": stats})
        atomic_write_bytes(round_dir / "DONE", b"ok")  # whole or absent, even on a full disk
        shutil.rmtree(state.scratch, ignore_errors=True)  # the round's model is saved
