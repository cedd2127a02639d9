"""annotate-nethack: an annotator's preference over pairs of Motif captions sampled from the rollouts.

Pairs of observations are drawn uniformly from all rollout steps (seeded per chunk). Each observation's caption
is its last ``context_steps`` messages (``pipeline.nethack.captions``). The annotator is any backend:

- ``preferences`` (Motif): FIRST / SECOND / TIE / UNKNOWN per pair — the Motif prompt (goal and template from
  params) on a chat backend, or, the embedded default, the caption whose embedding is closer to the goal
  sentence. Identical captions are a TIE without a call.
- ``labels`` (ONI): each distinct caption is labelled helpful / unhelpful once; a pair's preference follows
  from its two labels (helpful beats unhelpful, equal labels tie, an UNKNOWN label makes the pair UNKNOWN).

Output: ``data/annotate_nethack`` — chunked Parquet, one row per pair with the raw answer and what its requests cost
(``attempts``, ``cached``, ``tokens_in`` / ``tokens_out``: ``pipeline.llm.ledger.Usage``, in the run that wrote the
row). Resume: finished chunks are kept; on a rerun only the rows still UNKNOWN in them are asked again.

    curio stage annotate-nethack -S annotate_nethack.goal=gold
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.core.artifacts import ChunkedDataset, chunk_seed, dataset_hash, read_table, redo_rows, replace_rows
from pipeline.core.runners import ChunkJob, loaded, run_chunked
from pipeline.core.stage import Out, Stage, StageContext, StageResult
from pipeline.llm import make_backend, sampling_from_config
from pipeline.llm.ledger import metric_help as ledger_help
from pipeline.nethack.annotation import Annotation, annotate_preferences, label_messages
from pipeline.nethack.captions import window_captions
from pipeline.nethack.config import AnnotateNetHackConfig
from pipeline.params import Params

NAME = "annotate-nethack"
METRIC_HELP = {
    "pairs": "caption pairs annotated",
    "labels/first": "pairs where the annotator preferred the first caption",
    "labels/second": "pairs where it preferred the second",
    "labels/tie": "pairs it judged a tie",
    "labels/unknown": "pairs whose label could not be parsed",
    "unknown_fraction": "share of the pairs labelled UNKNOWN",
    "unknown_redone": "UNKNOWN labels of finished parts asked again in this run",
    **ledger_help("llm_annotator", "the annotator (an LLM backend)"),
    **ledger_help("llm_embedding", "the annotator (the embedding backend)"),
}

STAGE = Stage(
    NAME,
    params=["seed", "annotate_nethack"],
    code=["pipeline/nethack/captions.py", "pipeline/nethack/annotation.py", "pipeline/nethack/prompts"],
    data=["data/rollout_nethack"],
    outs=[Out("data/annotate_nethack", persist=True)],
    track="nethack",
    metric_help=METRIC_HELP,
)

USAGE_FIELDS = [  # what the pair's requests cost (pipeline.llm.ledger.Usage); labels mode: both captions' requests
    pa.field("attempts", pa.int32()),  # sends, retries included; 0 = none of its own
    pa.field("cached", pa.bool_()),  # answered without a send (cache, or the same request in the batch); null: no
    # request (the embedding annotator, identical captions)
    pa.field("tokens_in", pa.int64()),
    pa.field("tokens_out", pa.int64()),
]
SCHEMA = pa.schema(
    [
        pa.field("pair", pa.int64()),
        pa.field("episode_first", pa.int32()),
        pa.field("step_first", pa.int32()),
        pa.field("caption_first", pa.string()),
        pa.field("episode_second", pa.int32()),
        pa.field("step_second", pa.int32()),
        pa.field("caption_second", pa.string()),
        pa.field("label", pa.string()),  # FIRST / SECOND / TIE / UNKNOWN
        pa.field("raw", pa.string()),  # the answer; embedding: similarities; labels mode: JSON of both labels
        *USAGE_FIELDS,
    ]
)
ROW_SCHEMA_VERSION = 2  # 2: the usage columns


def annotate(backend: Any, cfg: AnnotateNetHackConfig, pairs: list[tuple[str, str]]) -> list[Annotation]:
    """(label, raw, usage) for caption pairs, by the configured mode."""
    sampling = sampling_from_config(cfg.annotator)
    if cfg.mode == "preferences":
        return list(annotate_preferences(
            backend, pairs, goal=cfg.goal, template=cfg.template, sampling=sampling, tie_margin=cfg.tie_margin
        ))
    captions = list(dict.fromkeys(c for pair in pairs for c in pair))
    labelled = label_messages(backend, captions, sampling, goal=cfg.goal, threshold=cfg.label_threshold)
    label_of = dict(zip(captions, labelled, strict=True))
    out, billed = [], set()
    for a, b in pairs:
        (la, ra, ua), (lb, rb, ub) = label_of[a], label_of[b]
        if "UNKNOWN" in (la, lb):
            label = "UNKNOWN"
        elif la == lb:
            label = "TIE"
        else:
            label = "FIRST" if la == "helpful" else "SECOND"
        # a caption is asked once: its request is the first pair's that shows it, the later ones share it
        usage = (ua if a not in billed else ua.shared()) + (ub if b not in billed and b != a else ub.shared())
        billed.update((a, b))
        out.append(Annotation(label, json.dumps({"first": [la, ra], "second": [lb, rb]}), usage))
    return out


def usage_columns(answers: list[Annotation]) -> dict[str, list]:
    return {"attempts": [a.usage.attempts for a in answers], "cached": [a.usage.cached for a in answers],
            "tokens_in": [a.usage.tokens_in for a in answers], "tokens_out": [a.usage.tokens_out for a in answers]}


def pair_indices(params: Params, index: int, num_steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The two step rows of each pair of chunk ``index`` (uniform over all steps, seeded by the chunk)."""
    cfg = params.annotate_nethack
    size = min(cfg.pairs_per_chunk, cfg.num_pairs - index * cfg.pairs_per_chunk)
    rng = np.random.default_rng(chunk_seed(params.seed, NAME, index))
    return rng.integers(num_steps, size=size), rng.integers(num_steps, size=size)


def redo_unknown(ds: ChunkedDataset, backend: Any, cfg: AnnotateNetHackConfig) -> int:
    """Ask again for the UNKNOWN rows of finished parts (each request at most ``annotator.max_attempts`` times
    over all runs: the cache counts them); returns how many rows were asked."""

    def fix(table: pa.Table, rows: list[int]) -> pa.Table:
        first, second = table["caption_first"].to_pylist(), table["caption_second"].to_pylist()
        answers = annotate(backend, cfg, [(first[i], second[i]) for i in rows])
        return replace_rows(table, rows, {"label": [a.label for a in answers], "raw": [a.raw for a in answers],
                                          **usage_columns(answers)})

    return redo_rows(ds, "label", "UNKNOWN", fix, SCHEMA)


class PairChunks(Sequence):
    """Chunk i's pairs with their captions, every column but the answer (computed when asked for: the driver
    holds the rollout messages, a worker gets one chunk's captions)."""

    def __init__(self, params: Params, messages: list[str], episodes: np.ndarray, steps: np.ndarray) -> None:
        self.params, self.messages, self.episodes, self.steps = params, messages, episodes, steps
        cfg = params.annotate_nethack
        self.cfg, self.num_chunks = cfg, -(-cfg.num_pairs // cfg.pairs_per_chunk)

    def __len__(self) -> int:
        return self.num_chunks

    def __getitem__(self, index: int) -> pa.Table:  # type: ignore[override]
        a, b = pair_indices(self.params, index, len(self.messages))
        start = index * self.cfg.pairs_per_chunk
        return pa.table({
            "pair": np.arange(start, start + len(a), dtype=np.int64),
            "episode_first": self.episodes[a].astype(np.int32),
            "step_first": self.steps[a].astype(np.int32),
            "caption_first": window_captions(self.messages, self.episodes, a, self.cfg.context_steps),
            "episode_second": self.episodes[b].astype(np.int32),
            "step_second": self.steps[b].astype(np.int32),
            "caption_second": window_captions(self.messages, self.episodes, b, self.cfg.context_steps),
        })


def annotate_chunk(cfg: AnnotateNetHackConfig, backend: Any, _index: int, pairs: pa.Table) -> pa.Table:
    """One chunk: the annotator's (label, raw) for each pair of captions."""
    first, second = pairs["caption_first"].to_pylist(), pairs["caption_second"].to_pylist()
    answers = annotate(backend, cfg, list(zip(first, second, strict=True)))
    columns = {"label": [a.label for a in answers], "raw": [a.raw for a in answers], **usage_columns(answers)}
    for name, values in columns.items():
        pairs = pairs.append_column(SCHEMA.field(name), pa.array(values, SCHEMA.field(name).type))
    return pairs


def run(params: Params, ctx: StageContext, backend: Any = None) -> StageResult:
    """``backend`` replaces the configured annotator (tests)."""
    cfg = params.annotate_nethack
    rollouts = params.data_path("rollout_nethack")
    out = params.data_path("annotate_nethack")
    steps = read_table(rollouts, ["episode", "step", "message"])
    messages = steps["message"].to_pylist()
    episodes = steps["episode"].to_numpy()
    step_numbers = steps["step"].to_numpy()
    chunks = PairChunks(params, messages, episodes, step_numbers)
    if backend is None:  # the configured annotator: built once per process that annotates chunks, any runner
        load = partial(make_backend, cfg.annotator, role="annotator")
        backend = loaded(load)
        job: ChunkJob | Callable[[int], pa.Table] = ChunkJob(run=partial(annotate_chunk, cfg), inputs=chunks,
                                                             load=load)
    else:  # a given backend (tests) annotates in this process
        def job(index: int) -> pa.Table:
            return annotate_chunk(cfg, backend, index, chunks[index])

    params_hash = params.section_hash(STAGE.params)
    upstream = {"rollouts": dataset_hash(rollouts)}
    redone = redo_unknown(ChunkedDataset(out, params_hash=params_hash, upstream=upstream,
                                         schema_version=ROW_SCHEMA_VERSION), backend, cfg)
    run_chunked(
        out,
        num_chunks=len(chunks),
        make_chunk=job,
        params_hash=params_hash,
        upstream=upstream,
        schema=SCHEMA,
        desc="annotate-nethack chunks",
        schema_version=ROW_SCHEMA_VERSION,
    )
    counts = Counter(read_table(out, ["label"])["label"].to_pylist())
    total = sum(counts.values())
    metrics: dict[str, float | int | str] = {
        "pairs": total,
        **{f"labels/{k.lower()}": counts.get(k, 0) for k in ("FIRST", "SECOND", "TIE", "UNKNOWN")},
        "unknown_fraction": counts.get("UNKNOWN", 0) / max(total, 1),
        "unknown_redone": redone,
    }
    ledger = getattr(backend, "ledger", None)
    if ledger is not None:
        metrics.update(ledger.metrics())
    return StageResult(metrics=metrics, outputs=[str(out)])
