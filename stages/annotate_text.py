"""annotate-text: a judge labels every trajectory VALID / NOTVALID / UNKNOWN.

The judge is a backend chosen in params (``annotate_text.judge``): ``rules`` = the game's program check
(exact match of the final guess), or any LLM backend with the trajectory-judge prompt. Output:
``data/annotate_text`` — the rollout rows plus ``judge_label``, ``judge_raw`` and what asking cost
(``judge_attempts``, ``judge_cached``, ``judge_tokens_in`` / ``judge_tokens_out``: ``pipeline.llm.ledger.Usage``, in
the run that wrote the row; a program's verdict costs nothing and ``judge_cached`` is null). Judged in chunks, so a
rerun after a kill (or with the response cache warm) repeats no call; a rerun asks again for the UNKNOWN
verdicts only (each request at most ``judge.max_attempts`` times over all runs).
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import pyarrow as pa

from pipeline.core.artifacts import ChunkedDataset, dataset_hash, read_table, redo_rows, replace_rows
from pipeline.core.runners import ChunkJob, loaded, run_chunked
from pipeline.core.stage import Out, Stage, StageContext, StageResult
from pipeline.llm.ledger import metric_help as ledger_help
from pipeline.params import Params
from pipeline.text.judge import JudgeItem, Verdict, make_judge

NAME = "annotate-text"
METRIC_HELP = {
    "trajectories": "rollouts judged",
    "valid_rate": "share the judge labelled VALID (a win by the game's rules)",
    "unknown": "rollouts whose verdict could not be parsed (UNKNOWN; asked again on a rerun)",
    "claimed_but_invalid": "rollouts the game scored a win that the judge labelled NOTVALID",
    "unknown_redone": "UNKNOWN verdicts of finished parts asked again in this run",
    **ledger_help("judge", "the judge"),
}

STAGE = Stage(
    NAME,
    params=["annotate_text"],
    code=["pipeline/text/judge.py", "pipeline/text/prompts/judge.yaml"],
    data=["data/rollout_text"],
    outs=[Out("data/annotate_text", persist=True)],
    notes={"pipeline/text/judge.py": "the judge's code and prompt: editing either re-judges"},
    metric_help=METRIC_HELP,
)
ROWS_PER_CHUNK = 1024
ROW_SCHEMA_VERSION = 2  # 2: the judge's usage columns
VERDICT_FIELDS = [
    pa.field("judge_label", pa.string()),
    pa.field("judge_raw", pa.string()),
    pa.field("judge_attempts", pa.int32()),  # sends, retries included; 0 = none of its own
    pa.field("judge_cached", pa.bool_()),  # answered without a send (cache, or the same request in the batch)
    pa.field("judge_tokens_in", pa.int64()),
    pa.field("judge_tokens_out", pa.int64()),
]


def judge_items(rows: list[dict]) -> list[JudgeItem]:
    return [
        JudgeItem(
            task={"group": r["group"], "task_id": r["task_id"], "env": json.loads(r["secret"]),
                  "agent": r["category"], "difficulty": r["difficulty"], "split": r["split"]},
            conversation=r["conversation"],
            final_action=r["final_action"],
            claimed_success=r["success"],
        )
        for r in rows
    ]


def verdict_columns(verdicts: list[Verdict]) -> dict[str, list]:
    return {"judge_label": [v.label for v in verdicts], "judge_raw": [v.raw for v in verdicts],
            "judge_attempts": [v.usage.attempts for v in verdicts], "judge_cached": [v.usage.cached for v in verdicts],
            "judge_tokens_in": [v.usage.tokens_in for v in verdicts],
            "judge_tokens_out": [v.usage.tokens_out for v in verdicts]}


def judge_chunk(judge: Any, _index: int, part: pa.Table) -> pa.Table:
    """One chunk of rollout rows with the judge's label, raw answer and usage appended."""
    columns = verdict_columns(judge.judge(judge_items(part.to_pylist())))
    for field in VERDICT_FIELDS:
        part = part.append_column(field, pa.array(columns[field.name], field.type))
    return part


def run(params: Params, ctx: StageContext) -> StageResult:
    src = params.data_path("rollout_text")
    out = params.data_path("annotate_text")
    table = read_table(src)
    judge = loaded(load := partial(make_judge, params.annotate_text.judge))  # the chunks' judge, in this process
    num_chunks = max(1, -(-table.num_rows // ROWS_PER_CHUNK))
    slices = [table.slice(i * ROWS_PER_CHUNK, ROWS_PER_CHUNK) for i in range(num_chunks)]

    def rejudge(part: pa.Table, rows: list[int]) -> pa.Table:
        return replace_rows(part, rows, verdict_columns(judge.judge(judge_items(part.take(rows).to_pylist()))))

    params_hash, upstream = params.section_hash(STAGE.params), {"rollout_text": dataset_hash(src)}
    # A rerun asks again for the UNKNOWN verdicts of finished parts (bounded by judge.max_attempts per request).
    redone = redo_rows(ChunkedDataset(out, params_hash=params_hash, upstream=upstream,
                                      schema_version=ROW_SCHEMA_VERSION), "judge_label", "UNKNOWN", rejudge)
    run_chunked(out, num_chunks=num_chunks, make_chunk=ChunkJob(run=judge_chunk, inputs=slices, load=load),
                params_hash=params_hash, upstream=upstream, desc="judging", schema_version=ROW_SCHEMA_VERSION)
    labels = read_table(out, ["judge_label", "success"]).to_pylist()
    n = max(1, len(labels))
    metrics = {
        "trajectories": len(labels),
        "valid_rate": sum(r["judge_label"] == "VALID" for r in labels) / n,
        "unknown": sum(r["judge_label"] == "UNKNOWN" for r in labels),
        "claimed_but_invalid": sum(r["success"] and r["judge_label"] == "NOTVALID" for r in labels),
        "unknown_redone": redone,
    }
    metrics.update(judge.ledger.metrics("judge"))
    return StageResult(metrics=metrics, outputs=[str(out)])
