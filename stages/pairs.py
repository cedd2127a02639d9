"""pairs-text: PAPRIKA pairing and the SFT set.

Per task, trajectories are ranked by (failed, turns). Chosen: a success within ``turn_threshold`` turns of the
task's best success; rejected: a failure or a success more than ``turn_threshold`` turns worse than the best.
Judge-invalid "successes" count as successes, as failures, or are dropped (``judge_label_strategy``);
format-invalid episodes are dropped. Outputs (TRL conversational format: ``prompt``, ``chosen``,
``rejected`` as lists of {role, content}): ``data/pairs_text/preferences`` and ``data/pairs_text/sft``
(every success within the threshold — the SFT data).
"""

from __future__ import annotations

import random
from collections import defaultdict

from pipeline.artifacts import chunk_seed, dataset_hash, read_rows, run_chunked
from pipeline.config import Params
from pipeline.stage import StageContext, StageResult

NAME = "pairs-text"
PARAMS = ["seed", "pairs_text"]
PROMPT_MESSAGES = 2  # system + opening user message


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


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.pairs_text
    src = params.data_path("annotate_text")
    rows = read_rows(src)
    rng = random.Random(chunk_seed(params.seed, NAME, 0))
    pairs, sft = build(rows, cfg.turn_threshold, cfg.judge_label_strategy, cfg.pairs_per_task, rng)
    if not pairs:
        raise RuntimeError("pairs-text: no task has both a chosen and a rejected trajectory; "
                           "raise rollout_text.trajectories_per_task or the temperature")
    upstream = {"annotate_text": dataset_hash(src)}
    h = params.section_hash(PARAMS)
    out = params.data_path("pairs_text")
    run_chunked(out / "preferences", num_chunks=1, make_chunk=lambda _: pairs, params_hash=h,
                upstream=upstream, desc="pairs")
    run_chunked(out / "sft", num_chunks=1, make_chunk=lambda _: sft, params_hash=h, upstream=upstream,
                desc="sft set")
    tasks = len({(r["group"], r["task_id"]) for r in rows})
    return StageResult(
        metrics={
            "tasks": tasks,
            "pairs": len(pairs),
            "sft_trajectories": len(sft),
            "pairs_with_failed_rejected": sum(not p["rejected_success"] for p in pairs),
            "mean_chosen_turns": sum(p["chosen_turns"] for p in pairs) / len(pairs),
        },
        outputs=[str(out)],
    )
