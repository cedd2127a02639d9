"""rollout-text: the policy plays N train tasks × k trajectories, generation batched across episodes.

Output: ``data/rollout_text`` — chunked Parquet, one row per episode (pipeline.play.EPISODE_SCHEMA). A chunk
is ``tasks_per_chunk`` tasks × k samples with its own seed, so a killed run resumes at the first missing
chunk and produces exactly the rows an uninterrupted run would.
"""

from __future__ import annotations

from tqdm.auto import tqdm

from pipeline.artifacts import chunk_seed, dir_hash, read_rows, run_chunked
from pipeline.config import Params
from pipeline.llm.base import Sampling
from pipeline.play import EPISODE_SCHEMA, play_episodes, summarize
from pipeline.policies import game_tasks, load_policy_backend, make_games, policy_path
from pipeline.stage import StageContext, StageResult

NAME = "rollout-text"
PARAMS = ["seed", "policy", "games", "rollout_text"]


def sampling(params: Params) -> Sampling:
    cfg = params.rollout_text
    return Sampling(temperature=cfg.temperature, top_p=cfg.top_p, min_p=cfg.min_p, max_tokens=cfg.max_new_tokens)


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.rollout_text
    out = params.data_path("rollout_text")
    policy = load_policy_backend(params, "base")
    jobs = [(g, t) for g in make_games(params) for t in game_tasks(params, g, "train")]
    chunks = [jobs[i : i + cfg.tasks_per_chunk] for i in range(0, len(jobs), cfg.tasks_per_chunk)]
    total = len(jobs) * cfg.trajectories_per_task
    bar = tqdm(total=total, desc="rollout episodes", unit="ep")

    def make_chunk(index: int) -> list[dict]:
        episode_jobs = [(g, t, s) for g, t in chunks[index] for s in range(cfg.trajectories_per_task)]
        return play_episodes(
            policy, episode_jobs, sampling(params), seed=chunk_seed(params.seed, NAME, index),
            max_format_retries=cfg.max_format_retries, policy_name="base", on_turn=bar.update,
        )

    run_chunked(out, num_chunks=len(chunks), make_chunk=make_chunk, params_hash=params.section_hash(PARAMS),
                upstream={"policy": dir_hash(policy_path(params, "base"))}, schema=EPISODE_SCHEMA,
                desc="rollout chunks")
    bar.close()
    rows = read_rows(out, ["success", "invalid", "turns", "score"])
    return StageResult(metrics={f"train/{k}": v for k, v in summarize(rows).items()}, outputs=[str(out)])
