"""pairs-nethack: the preference dataset the reward model trains on.

UNKNOWN pairs are dropped; FIRST / SECOND / TIE become the soft label y = P(second is better) = 0 / 1 / 0.5
(ties only when ``keep_ties``). Each pair goes to ``train`` or ``val`` by a hash of (seed, pair id), so the split
does not move when pairs are added or removed.

Output: ``data/pairs_nethack`` — one Parquet part: pair, caption_first, caption_second, label, y, split.

    curio stage pairs-nethack -S pairs_nethack.val_fraction=0.1
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core.artifacts import dataset_hash, read_table
from pipeline.core.runners import run_chunked
from pipeline.core.stage import Out, Stage, StageContext, StageResult
from pipeline.params import Params

NAME = "pairs-nethack"
METRIC_HELP = {
    "annotated": "annotated caption pairs read",
    "pairs": "pairs kept (UNKNOWN labels dropped)",
    "dropped": "pairs dropped",
    "train": "pairs in the train split",
    "val": "pairs in the val split",
    "tie_fraction": "share of the kept pairs labelled a tie",
}

STAGE = Stage(
    NAME,
    params=["seed", "pairs_nethack"],
    data=["data/annotate_nethack"],
    outs=[Out("data/pairs_nethack")],
    track="nethack",
    metric_help=METRIC_HELP,
)

Y_OF_LABEL = {"FIRST": 0.0, "SECOND": 1.0, "TIE": 0.5}

SCHEMA = pa.schema(
    [
        pa.field("pair", pa.int64()),
        pa.field("caption_first", pa.string()),
        pa.field("caption_second", pa.string()),
        pa.field("label", pa.string()),
        pa.field("y", pa.float32()),  # probability that the second caption is the better one
        pa.field("split", pa.string()),  # train / val
    ]
)


def split_of(seed: int, pair: int, val_fraction: float) -> str:
    digest = hashlib.sha256(f"{seed}/{NAME}/{pair}".encode()).digest()
    return "val" if int.from_bytes(digest[:8], "little") / 2**64 < val_fraction else "train"


def build(annotations: pa.Table, seed: int, val_fraction: float, keep_ties: bool) -> pa.Table:
    keep = {"FIRST", "SECOND", "TIE"} if keep_ties else {"FIRST", "SECOND"}
    table = annotations.filter(pc.is_in(annotations["label"], pa.array(sorted(keep))))
    labels = table["label"].to_pylist()
    pairs = table["pair"].to_pylist()
    return pa.table(
        {
            "pair": table["pair"],
            "caption_first": table["caption_first"],
            "caption_second": table["caption_second"],
            "label": labels,
            "y": np.array([Y_OF_LABEL[label] for label in labels], dtype=np.float32),
            "split": [split_of(seed, p, val_fraction) for p in pairs],
        },
        schema=SCHEMA,
    )


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.pairs_nethack
    annotations = params.data_path("annotate_nethack")
    out = params.data_path("pairs_nethack")
    source = read_table(annotations, ["pair", "caption_first", "caption_second", "label"])
    run_chunked(
        out,
        num_chunks=1,
        make_chunk=lambda _: build(source, params.seed, cfg.val_fraction, cfg.keep_ties),
        params_hash=params.section_hash(STAGE.params),
        upstream={"annotations": dataset_hash(annotations)},
        schema=SCHEMA,
        desc="pairs-nethack",
    )
    table = read_table(out, ["label", "split"])
    split = np.asarray(table["split"].to_pylist())
    labels = np.asarray(table["label"].to_pylist())
    return StageResult(
        metrics={
            "annotated": source.num_rows,
            "pairs": table.num_rows,
            "dropped": source.num_rows - table.num_rows,
            "train": int((split == "train").sum()),
            "val": int((split == "val").sum()),
            "tie_fraction": float((labels == "TIE").mean()) if len(labels) else 0.0,
        },
        outputs=[str(out)],
    )
