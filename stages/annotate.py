"""annotate-text: a judge labels every trajectory VALID / NOTVALID / UNKNOWN.

The judge is a backend chosen in params (``annotate_text.judge``): ``rules`` = the game's program check
(exact match of the final guess), or any LLM backend with the trajectory-judge prompt. Output:
``data/annotate_text`` — the rollout rows plus ``judge_label`` and ``judge_raw``. Judged in chunks, so a
rerun after a kill (or with the response cache warm) repeats no call.
"""

from __future__ import annotations

import json

import pyarrow as pa

from pipeline.artifacts import dataset_hash, read_table, run_chunked
from pipeline.config import Params
from pipeline.llm.judge import JudgeItem, make_judge
from pipeline.stage import StageContext, StageResult

NAME = "annotate-text"
PARAMS = ["annotate_text"]
ROWS_PER_CHUNK = 1024


def run(params: Params, ctx: StageContext) -> StageResult:
    src = params.data_path("rollout_text")
    out = params.data_path("annotate_text")
    table = read_table(src)
    judge = make_judge(params.annotate_text.judge)
    num_chunks = max(1, -(-table.num_rows // ROWS_PER_CHUNK))

    def make_chunk(index: int) -> pa.Table:
        part = table.slice(index * ROWS_PER_CHUNK, ROWS_PER_CHUNK)
        rows = part.to_pylist()
        items = [
            JudgeItem(
                task={"group": r["group"], "task_id": r["task_id"], "env": json.loads(r["secret"]),
                      "agent": r["category"], "difficulty": r["difficulty"], "split": r["split"]},
                conversation=r["conversation"],
                final_action=r["final_action"],
                claimed_success=r["success"],
            )
            for r in rows
        ]
        verdicts = judge.judge(items)
        part = part.append_column("judge_label", pa.array([v.label for v in verdicts], pa.string()))
        return part.append_column("judge_raw", pa.array([v.raw for v in verdicts], pa.string()))

    run_chunked(out, num_chunks=num_chunks, make_chunk=make_chunk, params_hash=params.section_hash(PARAMS),
                upstream={"rollout_text": dataset_hash(src)}, desc="judging")
    labels = read_table(out, ["judge_label", "success"]).to_pylist()
    n = max(1, len(labels))
    metrics = {
        "trajectories": len(labels),
        "valid_rate": sum(r["judge_label"] == "VALID" for r in labels) / n,
        "unknown": sum(r["judge_label"] == "UNKNOWN" for r in labels),
        "claimed_but_invalid": sum(r["success"] and r["judge_label"] == "NOTVALID" for r in labels),
    }
    metrics.update(judge.ledger.metrics("judge"))
    return StageResult(metrics=metrics, outputs=[str(out)])
