"""pairs-text: preference pairs and the SFT set, from the annotated rollouts.

``strategy: paprika`` (default) pairs whole trajectories. Per task, trajectories are ranked by (failed, turns).
Chosen: a success within ``turn_threshold`` turns of the task's best success; rejected: a failure or a success
more than ``turn_threshold`` turns worse than the best. Judge-invalid "successes" count as successes, as
failures, or are dropped (``judge_label_strategy``); format-invalid episodes are dropped.

``strategy: multiturn`` pairs single turns (CollabLLM-style multi-turn-aware reward, ``pipeline.text.multiturn_pairs``):
per task, ``states_per_task`` conversation prefixes of the rollouts, ``num_candidates`` next turns each from the
base policy, ``num_samples`` continuations per candidate played on for ``window_size`` agent turns and scored by
``pairs_text.judge``; chosen = the best candidate, rejected = the worst. Computed in chunks of ``tasks_per_chunk``
tasks, each with its own seed, so a killed run resumes where it stopped.

Outputs (TRL conversational format: ``prompt``, ``chosen``, ``rejected`` as lists of {role, content}; for
multiturn, prompt = the conversation prefix and chosen / rejected = one assistant turn):
``data/pairs_text/preferences`` and ``data/pairs_text/sft`` (with either strategy, every success within the
threshold of its task's best — the SFT data).
"""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

from pipeline.core.artifacts import chunk_seed, dataset_hash, dir_hash, read_rows
from pipeline.core.config import ConfigError
from pipeline.core.errors import CurioError
from pipeline.core.runners import run_chunked
from pipeline.core.stage import Out, Stage, StageContext, StageResult
from pipeline.envs.base import Game
from pipeline.llm import sampling_from_config
from pipeline.llm.ledger import metric_help as ledger_help
from pipeline.params import Params
from pipeline.text.multiturn_pairs import EXACT_GROUPS, MULTITURN_PAIR_SCHEMA, ContinuationJudge, multiturn_chunk
from pipeline.text.play import PROMPT_MESSAGES, task_from_row
from pipeline.text.policies import load_policy_backend, make_games, policy_deps, policy_path

NAME = "pairs-text"


def _needs(params: Params) -> list[str]:
    # the base policy continues the conversations of the multi-turn strategy only
    multiturn = params.pairs_text.strategy == "multiturn"
    return ["data/annotate_text", *(policy_deps(params.policy, "base") if multiturn else [])]


METRIC_HELP = {
    "strategy": "pairs_text.strategy: paprika (best against worse trajectory) or multiturn (per-turn candidates)",
    "tasks": "train tasks with rollouts (of pairs_text.groups where it names some)",
    "groups": "the task groups the pairs and the SFT set were made from (pairs_text.groups, or every group rolled out)",
    "pairs": "preference pairs written",
    "sft_trajectories": "trajectories of the SFT set",
    "pairs_with_failed_rejected": "paprika: pairs whose rejected trajectory lost",
    "mean_chosen_turns": "paprika: mean turns of the chosen trajectories",
    "tasks_with_pairs": "multiturn: tasks that gave at least one pair",
    "mean_chosen_reward": "multiturn: mean judged reward of the chosen candidates",
    "mean_rejected_reward": "multiturn: mean judged reward of the rejected candidates",
    "mean_state_turn": "multiturn: mean turn of the states the candidates answer",
    "computed/states": "multiturn: states whose candidates this run computed (a resumed run skips finished chunks)",
    "computed/states_without_pair": "multiturn: of those, states whose candidates all scored the same",
    "computed/unparseable_candidates": "multiturn: candidates out of the answer format",
    "computed/continuations": "multiturn: continuations played from the candidates",
    "computed/unscored_continuations": "multiturn: continuations the judge could not score",
    **ledger_help("judge", "multiturn: the continuations' judge"),
}

STAGE = Stage(
    NAME,
    params=[
        "seed", "policy", "pairs_text", "rollout_text.temperature", "rollout_text.top_p", "rollout_text.min_p",
        "rollout_text.max_new_tokens", "rollout_text.max_format_retries", "rollout_text.batch_size",
        "rollout_text.environment",
    ],
    code=[
        "pipeline/text/play.py", "pipeline/text/multiturn_reward.py", "pipeline/text/multiturn_pairs.py",
        "pipeline/text/prompts/multiturn_judge.yaml",
    ],
    data=["data/annotate_text", "data/bootstrap"],
    needs=_needs,
    outs=[Out("data/pairs_text")],
    notes={"data/bootstrap": "strategy multiturn samples candidate turns from the base policy"},
    metric_help=METRIC_HELP,
)


def effective_success(row: dict, strategy: str) -> bool | None:
    """Success after applying the judge-label strategy; None = drop the trajectory."""
    if row["invalid"]:
        return None
    if row["success"] and row.get("judge_label") == "NOTVALID":
        return {"as_success": True, "as_failure": False, "drop": None}[strategy]
    return bool(row["success"])


def split_task(rows: list[dict], threshold: int, strategy: str) -> tuple[list[dict], list[dict]]:
    """(chosen candidates, rejected candidates) of one task's trajectories."""
    scored = [(effective_success(r, strategy), r) for r in rows]
    scored = [(s, r) for s, r in scored if s is not None]
    wins = [r for s, r in scored if s]
    if not wins:
        return [], [r for _, r in scored]
    best = min(r["turns"] for r in wins)
    chosen = [r for r in wins if r["turns"] <= best + threshold]
    rejected = [r for s, r in scored if not s or r["turns"] > best + threshold]
    return chosen, rejected


def make_pair(chosen: dict, rejected: dict) -> dict:
    conv_c, conv_r = chosen["conversation"], rejected["conversation"]
    return {
        "group": chosen["group"],
        "task_id": chosen["task_id"],
        "prompt": conv_c[:PROMPT_MESSAGES],
        "chosen": conv_c[PROMPT_MESSAGES:],
        "rejected": conv_r[PROMPT_MESSAGES:],
        "chosen_turns": chosen["turns"],
        "rejected_turns": rejected["turns"],
        "rejected_success": bool(rejected["success"]),
    }


def build(rows: list[dict], threshold: int, strategy: str, pairs_per_task: int,
          rng: random.Random) -> tuple[list[dict], list[dict]]:
    by_task: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        by_task[(r["group"], r["task_id"])].append(r)
    pairs, sft = [], []
    for key in sorted(by_task):
        task_rows = sorted(by_task[key], key=lambda r: r["sample"])
        chosen, rejected = split_task(task_rows, threshold, strategy)
        sft.extend({"group": r["group"], "task_id": r["task_id"], "messages": r["conversation"],
                    "turns": r["turns"]} for r in chosen)
        if chosen and rejected:
            for _ in range(pairs_per_task):
                pairs.append(make_pair(rng.choice(chosen), rng.choice(rejected)))
    return pairs, sft


def check_exact_judge(games: list[Game]) -> None:
    """The rules 'exact' judge scores games with a knowledge base only, at any tier (``GAME@TIER``)."""
    inexact = [g.name for g in games if type(g).name not in EXACT_GROUPS]
    if inexact:
        raise ConfigError(f"params: pairs_text.judge: the rules 'exact' judge needs a knowledge base "
                          f"({', '.join(EXACT_GROUPS)}); the rollouts also hold {', '.join(inexact)}: use an "
                          f"LLM judge (hf, vllm, openai), or leave them out with pairs_text.groups")


def build_multiturn(params: Params, rows: list[dict], out: Path, upstream: dict[str, str], h: str,
                    stats: dict[str, int]) -> dict[str, float | int]:
    """Write the per-turn pairs of every task to ``out`` (chunked, resumable); returns the LLM judge's ledger."""
    cfg = params.pairs_text
    by_task: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        by_task[(r["group"], r["task_id"])].append(r)
    keys = sorted(by_task)
    games = {g.name: g for g in make_games(params, sorted({g for g, _ in keys}))}  # the policy's move parsing
    if cfg.judge.backend == "rules":
        check_exact_judge(list(games.values()))
    chunks = [keys[i : i + cfg.tasks_per_chunk] for i in range(0, len(keys), cfg.tasks_per_chunk)]
    policy = load_policy_backend(params, "base")
    judge = ContinuationJudge(cfg.judge)
    upstream = {**upstream, "policy": dir_hash(policy_path(params, "base"))}

    def make_chunk(index: int) -> list[dict]:
        tasks = [(games[g], task_from_row(by_task[(g, t)][0]), by_task[(g, t)]) for g, t in chunks[index]]
        return multiturn_chunk(policy, judge, tasks, cfg, sampling_from_config(params.rollout_text),
                               chunk_seed(params.seed, NAME, index), params.rollout_text.max_format_retries, stats)

    try:
        run_chunked(out, num_chunks=len(chunks), make_chunk=make_chunk, params_hash=h, upstream=upstream,
                    schema=MULTITURN_PAIR_SCHEMA, desc="per-turn pairs")
    finally:
        judge.close()
        policy.close()  # a vllm policy's server
    return {} if judge.rules else judge.ledger.metrics("judge")


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.pairs_text
    src = params.data_path("annotate_text")
    rows = read_rows(src)
    held = sorted({r["group"] for r in rows})
    if cfg.groups is not None:
        absent = [g for g in cfg.groups if g not in held]
        if absent:
            raise ConfigError(f"params: pairs_text.groups: {', '.join(absent)} not in the annotated rollouts "
                              f"(they hold {', '.join(held)})")
        rows = [r for r in rows if r["group"] in cfg.groups]
    rng = random.Random(chunk_seed(params.seed, NAME, 0))
    pairs, sft = build(rows, cfg.turn_threshold, cfg.judge_label_strategy, cfg.pairs_per_task, rng)
    upstream = {"annotate_text": dataset_hash(src)}
    h = params.section_hash(STAGE.params)
    out = params.data_path("pairs_text")
    tasks = len({(r["group"], r["task_id"]) for r in rows})
    stats: dict[str, int] = defaultdict(int)
    if cfg.strategy == "multiturn":
        judge_metrics = build_multiturn(params, rows, out / "preferences", upstream, h, stats)
        pairs = read_rows(out / "preferences")
        if not pairs:
            raise CurioError("pairs-text: no state gave two candidates with different rewards; raise "
                               "pairs_text.states_per_task / num_candidates or rollout_text.temperature")
        metrics: dict[str, float | int | str] = {
            "tasks": tasks,
            "pairs": len(pairs),
            "tasks_with_pairs": len({(p["group"], p["task_id"]) for p in pairs}),
            "mean_chosen_reward": sum(p["chosen_reward"] for p in pairs) / len(pairs),
            "mean_rejected_reward": sum(p["rejected_reward"] for p in pairs) / len(pairs),
            "mean_state_turn": sum(p["state_turn"] for p in pairs) / len(pairs),
            # counted over the chunks computed by this run (a resumed run skips finished ones)
            **{f"computed/{k}": v for k, v in sorted(stats.items())},
            **judge_metrics,
        }
    else:
        if not pairs:
            raise CurioError("pairs-text: no task has both a chosen and a rejected trajectory; "
                             "raise rollout_text.trajectories_per_task or the temperature")
        run_chunked(out / "preferences", num_chunks=1, make_chunk=lambda _: pairs, params_hash=h,
                    upstream=upstream, desc="pairs")
        metrics = {
            "tasks": tasks,
            "pairs": len(pairs),
            "pairs_with_failed_rejected": sum(not p["rejected_success"] for p in pairs),
            "mean_chosen_turns": sum(p["chosen_turns"] for p in pairs) / len(pairs),
        }
    run_chunked(out / "sft", num_chunks=1, make_chunk=lambda _: sft, params_hash=h, upstream=upstream,
                desc="sft set")
    metrics["sft_trajectories"] = len(sft)
    metrics["strategy"] = cfg.strategy
    metrics["groups"] = ",".join(sorted({r["group"] for r in rows}))
    return StageResult(metrics=metrics, outputs=[str(out)])
