"""rollout-text: the policy plays N train tasks × k trajectories, generation batched across episodes.

Output: ``data/rollout_text`` — chunked Parquet, one row per episode (pipeline.text.play.EPISODE_SCHEMA). A chunk
is ``tasks_per_chunk`` tasks × k samples with its own seed, so a killed run resumes at the first missing
chunk and produces exactly the rows an uninterrupted run would.

With ``rollout_text.curriculum.enabled`` the chunks are curriculum rounds instead (PAPRIKA): each round the
UCB curriculum (pipeline/text/curriculum.py) picks ``tasks_per_round`` train tasks, they are played k times, and
each task's learning potential (coefficient of variation of its k scores: turns, failures counted as the turn
limit) updates its difficulty arm. The curriculum state before round i is rebuilt by replaying the picks and
updates of the finished rounds 0..i-1 from their rows on disk (picks use per-round seeds), so a resumed run
picks, plays and writes exactly what an uninterrupted one does.
"""

from __future__ import annotations

import math
import random
from functools import partial

from tqdm.auto import tqdm

from pipeline.core.artifacts import chunk_seed, dir_hash, read_part, read_rows
from pipeline.core.runners import ChunkJob, run_chunked
from pipeline.core.stage import Out, Stage, StageContext, StageResult
from pipeline.envs.base import Game, Task
from pipeline.envs.external import is_external, turn_limit_metrics
from pipeline.llm import sampling_from_config
from pipeline.llm.base import ChatBackend
from pipeline.llm.environment import environment_accounting, environment_metrics
from pipeline.llm.ledger import metric_help as ledger_help
from pipeline.params import Params
from pipeline.text.curriculum import UCBCurriculum, round_samples, task_key, update_from_round
from pipeline.text.play import EPISODE_SCHEMA, play_episodes, summarize, summary_help
from pipeline.text.policies import game_tasks, load_policy_backend, make_games, policy_deps, policy_path

NAME = "rollout-text"
# Training stages read the training groups only: changing games.eval_groups / max_eval_tasks reruns nothing here.


def _needs(params: Params) -> list[str]:
    return policy_deps(params.policy, "base")  # the policy it plays


METRIC_HELP = {
    **summary_help("train/", "the base policy's rollouts on the train tasks"),
    **ledger_help("environment/", "the LLM environment (a game an LLM hosts)"),
    "curriculum/rounds": "curriculum rounds played (rollout_text.curriculum.enabled)",
    "curriculum/mean_potential": "mean learning potential of the tasks played (the coefficient of variation of their "
                                 "turn counts)",
    "curriculum/{arm}/pulls": "tasks of this difficulty the curriculum picked",
    "curriculum/{arm}/mean_potential": "mean learning potential of this difficulty's tasks played",
    "train/{group}/turn_limit": "share of an external group's episodes (textarena:, openenv:) that Curio's turn limit "
                                "ended, the environment had not",
}

STAGE = Stage(
    NAME,
    params=["seed", "policy", "games.groups", "games.max_train_tasks", "games.val_fraction", "rollout_text"],
    code=["pipeline/text/play.py", "pipeline/envs"],
    data=["data/bootstrap"],
    needs=_needs,
    outs=[Out("data/rollout_text", persist=True)],
    metric_help=METRIC_HELP,
)


class CurriculumRounds:
    """Rollout rounds picked by PAPRIKA's UCB curriculum; round ``i`` is chunk ``i`` of ``out``.

    The curriculum before round i = a fresh one + (pick, update) replayed for rounds 0..i-1, the picks with
    each round's own seed and the updates from that round's rows on disk. Consecutive rounds in one process
    just carry the in-memory state forward (the same arithmetic, in the same order).
    """

    def __init__(self, params: Params, jobs: list[tuple[Game, Task]], out, policy: ChatBackend | None = None,
                 on_turn=None) -> None:
        self.params, self.out, self.policy, self.on_turn = params, out, policy, on_turn
        cfg = params.rollout_text.curriculum
        self.k = params.rollout_text.trajectories_per_task
        self.per_round = cfg.tasks_per_round
        self.num_rounds = cfg.rounds or max(1, math.ceil(len(jobs) / cfg.tasks_per_round))
        self.task_of = {task_key(g.name, t.task_id): (g, t) for g, t in jobs}
        arm_of = {key: t.difficulty if cfg.arms == "difficulty" else f"{g.name}/{t.difficulty}"
                  for key, (g, t) in self.task_of.items()}
        self.new = lambda: UCBCurriculum(arm_of, alpha=cfg.alpha)
        self.curriculum = self.new()
        self.applied = 0  # rounds folded into self.curriculum

    def pick_rng(self, index: int) -> random.Random:
        return random.Random(chunk_seed(self.params.seed, f"{NAME}/curriculum", index))

    def episode_jobs(self, picked: list[str]) -> list[tuple[Game, Task, int]]:
        """k samples per pick; a task picked twice in a round gets samples k..2k-1 the second time."""
        return [(*self.task_of[key], sample) for key, sample in round_samples(picked, self.k)]

    def apply(self, index: int, picked: list[str], rows: list[dict]) -> None:
        """Update the arms with the round's rows: one learning potential per pick, from its k scores."""
        update_from_round(self.curriculum, picked, rows, self.k, f"{self.out}: round {index}",
                          "; remove the dataset to rebuild it")

    def state_before(self, index: int) -> UCBCurriculum:
        if self.applied > index:
            self.curriculum, self.applied = self.new(), 0
        while self.applied < index:
            r = self.applied
            picked = self.curriculum.select(self.pick_rng(r), self.per_round)
            self.apply(r, picked, read_part(self.out, r, ["group", "task_id", "sample", "score"]))
            self.applied += 1
        return self.curriculum

    def make_chunk(self, index: int) -> list[dict]:
        cfg = self.params.rollout_text
        picked = self.state_before(index).select(self.pick_rng(index), self.per_round)
        rows = play_episodes(
            self.policy, self.episode_jobs(picked), sampling_from_config(self.params.rollout_text),
            seed=chunk_seed(self.params.seed, NAME, index), max_format_retries=cfg.max_format_retries,
            policy_name="base", on_turn=self.on_turn,
        )
        self.apply(index, picked, rows)
        self.applied = index + 1
        return rows

    def metrics(self) -> dict[str, float]:
        c = self.state_before(self.num_rounds)
        count = sum(c.potential_count.values())
        out: dict[str, float] = {
            "curriculum/rounds": self.num_rounds,
            "curriculum/mean_potential": sum(c.potential_sum.values()) / count if count else 0.0,
        }
        for arm in c.arms:
            out[f"curriculum/{arm}/pulls"] = c.pulls[arm]
            out[f"curriculum/{arm}/mean_potential"] = c.mean_potential(arm)
        return out


def run_curriculum(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.rollout_text
    out = params.data_path("rollout_text")
    policy = load_policy_backend(params, "base")
    jobs = [(g, t) for g in make_games(params) for t in game_tasks(params.games, g, "train")]
    bar = tqdm(total=0, desc="rollout episodes", unit="ep")
    rounds = CurriculumRounds(params, jobs, out, policy, on_turn=bar.update)
    bar.total = rounds.num_rounds * rounds.per_round * cfg.trajectories_per_task
    run_chunked(out, num_chunks=rounds.num_rounds, make_chunk=rounds.make_chunk,
                params_hash=params.section_hash(STAGE.params),
                upstream={"policy": dir_hash(policy_path(params, "base"))},
                schema=EPISODE_SCHEMA, desc="curriculum rounds")
    bar.close()
    rows = read_rows(out, ["success", "invalid", "turns", "score"])
    metrics = {f"train/{k}": v for k, v in summarize(rows).items()}
    metrics.update(environment_metrics(g for g, _ in jobs))  # the LLM environment's ledger, if any
    return StageResult(metrics={**metrics, **rounds.metrics()}, outputs=[str(out)])


def rollout_state(params: Params) -> tuple[ChatBackend, dict[str, tuple[Game, Task]]]:
    """What every rollout chunk shares, built once per process: the base policy and the train tasks by key."""
    tasks = {task_key(g.name, t.task_id): (g, t) for g in make_games(params)
             for t in game_tasks(params.games, g, "train")}
    return load_policy_backend(params, "base"), tasks


def rollout_chunk(params: Params, state: tuple[ChatBackend, dict[str, tuple[Game, Task]]], index: int,
                  keys: list[str]) -> list[dict]:
    """Chunk ``index``: its tasks (by key) × k samples, with the chunk's own seed."""
    cfg = params.rollout_text
    policy, tasks = state
    episode_jobs = [(*tasks[key], s) for key in keys for s in range(cfg.trajectories_per_task)]
    return play_episodes(policy, episode_jobs, sampling_from_config(cfg), seed=chunk_seed(params.seed, NAME, index),
                         max_format_retries=cfg.max_format_retries, policy_name="base")


def run(params: Params, ctx: StageContext) -> StageResult:
    if params.rollout_text.curriculum.enabled:
        return run_curriculum(params, ctx)
    cfg = params.rollout_text
    out = params.data_path("rollout_text")
    # Chunks as data (task keys): any runner's worker loads the policy once and plays the chunks it is given.
    with environment_accounting() as environment:
        keys = [task_key(g.name, t.task_id) for g in make_games(params) for t in game_tasks(params.games, g, "train")]
        chunks = [keys[i : i + cfg.tasks_per_chunk] for i in range(0, len(keys), cfg.tasks_per_chunk)]
        bar = tqdm(total=len(keys) * cfg.trajectories_per_task, desc="rollout episodes", unit="ep")
        run_chunked(out, num_chunks=len(chunks),
                    make_chunk=ChunkJob(run=partial(rollout_chunk, params), inputs=chunks,
                                        load=partial(rollout_state, params)),
                    params_hash=params.section_hash(STAGE.params),
                    upstream={"policy": dir_hash(policy_path(params, "base"))},
                    schema=EPISODE_SCHEMA, desc="rollout chunks",
                    on_chunk=lambda i: bar.update(len(chunks[i]) * cfg.trajectories_per_task))
    bar.close()
    rows = read_rows(out, ["success", "invalid", "turns", "score"])
    metrics = {f"train/{k}": v for k, v in summarize(rows).items()}
    metrics.update(environment.metrics())  # the LLM environment's ledger (of this process's chunks), if any
    if any(is_external(g) for g in params.games.groups):  # episodes that Curio's turn limit ended, not the game
        metrics.update(turn_limit_metrics(read_rows(out, ["group", "conversation"]), "train/"))
    return StageResult(metrics=metrics, outputs=[str(out)])
