"""annotate-utterances: Motif's pairwise annotation for the text agent (``rl_text.reward: motif``).

From the base policy's rollouts (``data/rollout_text``), a seeded sample of ``annotate_utterances.num_pairs``
pairs of moves: the same task and agent turn in two plays. A judge (``annotate_utterances.judge``) says which
move is better: rules ``exact`` from the game's knowledge base, or any chat backend through the Motif-style
prompt, its one retry prompt and the response cache (``pipeline.text.utterance_prefs``). Output:
``data/annotate_utterances``, one row per pair: both moves, the texts the reward model reads (the move and the
messages before it), ``label`` FIRST / SECOND / TIE / UNKNOWN, the raw answer and what asking cost. Chunked: a
rerun after a kill repeats no call, and a rerun asks again for the UNKNOWN rows only (each request at most
``judge.max_attempts`` times over all runs).

With any other ``rl_text.reward`` nothing reads it: the stage writes ``idle.json`` saying so, in a second.
"""

from __future__ import annotations

import random
import shutil
from typing import Any

import pyarrow as pa

from pipeline.core.artifacts import (
    ChunkedDataset,
    atomic_write_json,
    chunk_seed,
    dataset_hash,
    read_rows,
    read_table,
    redo_rows,
    replace_rows,
)
from pipeline.core.runners import run_chunked
from pipeline.core.stage import IDLE, Out, Stage, StageContext, StageResult
from pipeline.envs.base import make_game
from pipeline.llm.ledger import metric_help as ledger_help
from pipeline.params import Params
from pipeline.text.utterance_prefs import UtterancePair, UtterancePreferenceJudge, utterance_pairs

NAME = "annotate-utterances"
METRIC_HELP = {
    "idle": "1 when rl_text.reward is not motif: nothing to label (the only metric then)",
    "pairs": "move pairs labelled",
    "unknown_redone": "UNKNOWN labels of finished parts asked again in this run",
    "first_rate": "share of the pairs where the judge preferred the first move",
    "second_rate": "share where it preferred the second",
    "tie_rate": "share it judged a tie",
    "unknown_rate": "share whose label could not be parsed",
    **ledger_help("judge", "the judge"),
}

STAGE = Stage(
    NAME,
    params=["seed", "rl_text.reward", "policy.free_answers", "annotate_utterances"],
    code=["pipeline/text/utterance_prefs.py", "pipeline/text/prompts/utterance_preference.yaml",
          "pipeline/llm/pairwise.py"],
    data=["data/rollout_text"],
    outs=[Out("data/annotate_utterances", persist=True)],
    notes={"pipeline/text/utterance_prefs.py": "the judge's code and prompt: editing either re-judges"},
    metric_help=METRIC_HELP,
)
PAIRS_PER_CHUNK = 512
ROW_SCHEMA = pa.schema([
    ("pair", pa.int64()), ("group", pa.string()), ("task_id", pa.string()), ("turn", pa.int32()),
    ("sample_first", pa.int32()), ("sample_second", pa.int32()),
    ("move_first", pa.string()), ("move_second", pa.string()),
    ("text_first", pa.string()), ("text_second", pa.string()),
    ("label", pa.string()), ("raw", pa.string()),
    ("attempts", pa.int32()), ("cached", pa.bool_()), ("tokens_in", pa.int64()), ("tokens_out", pa.int64()),
])


def idle(params: Params) -> str | None:
    """Why the stage has nothing to do (None: it has)."""
    if params.rl_text.reward != "motif":
        return "only rl_text.reward: motif reads this output; it is idle for the other rewards"
    return None


def write_idle(out, reason: str) -> StageResult:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    atomic_write_json(out / IDLE, {"idle": reason})
    return StageResult(metrics={"idle": 1}, outputs=[str(out)])


def verdict_columns(judge: UtterancePreferenceJudge, pairs: list[UtterancePair]) -> dict[str, list[Any]]:
    got = judge.judge(pairs)
    return {"label": [a.label for a in got], "raw": [a.raw for a in got],
            "attempts": [a.usage.attempts for a in got], "cached": [a.usage.cached for a in got],
            "tokens_in": [a.usage.tokens_in for a in got], "tokens_out": [a.usage.tokens_out for a in got]}


def run(params: Params, ctx: StageContext) -> StageResult:
    src, out = params.data_path("rollout_text"), params.data_path("annotate_utterances")
    reason = idle(params)
    if reason is not None:
        return write_idle(out, reason)
    (out / IDLE).unlink(missing_ok=True)
    cfg = params.annotate_utterances
    rows = read_table(src, ["group", "task_id", "sample", "secret", "category", "difficulty", "split", "conversation",
                            "invalid", "success", "final_action"]).to_pylist()
    pairs = utterance_pairs(rows, cfg.num_pairs, random.Random(chunk_seed(params.seed, NAME, 0)))
    if not pairs:
        raise ValueError("annotate-utterances: no two plays of one task in data/rollout_text to compare (set "
                         "rollout_text.trajectories_per_task >= 2)")
    games = {g: make_game(g) for g in sorted({p.group for p in pairs})}
    for game in games.values():  # moves parse as they did in play
        game.free_answers = params.policy.free_answers
    judge = UtterancePreferenceJudge(cfg.judge, games, cfg.context_messages)
    chunks = [list(range(i, min(i + PAIRS_PER_CHUNK, len(pairs)))) for i in range(0, len(pairs), PAIRS_PER_CHUNK)]

    def chunk(index: int) -> list[dict]:
        picked = [pairs[i] for i in chunks[index]]
        verdicts = verdict_columns(judge, picked)
        out_rows = []
        for j, (i, p) in enumerate(zip(chunks[index], picked, strict=True)):
            first, second = judge.texts(p)
            out_rows.append({
                "pair": i, "group": p.group, "task_id": p.task_id, "turn": p.turn,
                "sample_first": p.rows[0]["sample"], "sample_second": p.rows[1]["sample"],
                "move_first": p.rows[0]["conversation"][p.indices[0]]["content"],
                "move_second": p.rows[1]["conversation"][p.indices[1]]["content"],
                "text_first": first, "text_second": second, **{k: v[j] for k, v in verdicts.items()},
            })
        return out_rows

    def rejudge(part: pa.Table, at: list[int]) -> pa.Table:
        which = part["pair"].to_pylist()
        return replace_rows(part, at, verdict_columns(judge, [pairs[which[i]] for i in at]))

    params_hash, upstream = params.section_hash(STAGE.params), {"rollout_text": dataset_hash(src)}
    try:
        redone = redo_rows(ChunkedDataset(out, params_hash=params_hash, upstream=upstream), "label", "UNKNOWN",
                           rejudge, ROW_SCHEMA)
        run_chunked(out, num_chunks=len(chunks), make_chunk=chunk, params_hash=params_hash, upstream=upstream,
                    schema=ROW_SCHEMA, desc="judging move pairs")
    finally:
        judge.close()
    labels = [r["label"] for r in read_rows(out, ["label"])]
    n = max(1, len(labels))
    metrics = {"pairs": len(labels), "unknown_redone": redone,
               **{f"{k.lower()}_rate": sum(x == k for x in labels) / n for k in ("FIRST", "SECOND", "TIE", "UNKNOWN")}}
    metrics.update(judge.ledger.metrics("judge"))
    return StageResult(metrics=metrics, outputs=[str(out)])
