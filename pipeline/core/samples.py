"""A few rows of a dataset, evenly spaced and JSON-safe: what a stage run logs to MLflow as a table, and how the
report's dataset pages (pipeline/reporting/viewer.py) sample a dataset too large for one page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.core.artifacts import read_manifest
from pipeline.core.cards import datasets_under

TTY_CELLS = 24 * 80  # a NetHack tty_chars frame
MLFLOW_ROWS = 20  # rows of each dataset a stage run logs as an MLflow table
MLFLOW_CELL = 2000  # characters of one cell


def sample_indices(n: int, cap: int) -> list[int]:
    """All of ``range(n)`` if ``n <= cap``, else ``cap`` evenly spaced indices ⌊i·n/cap⌋ (deterministic)."""
    if n <= cap:
        return list(range(n))
    return [i * n // cap for i in range(cap)]


def clean(v: Any) -> Any:
    """JSON-safe: NaN / inf as None, numpy scalars as Python ones."""
    if isinstance(v, float | np.floating):
        return float(v) if np.isfinite(v) else None
    if isinstance(v, np.integer):
        return int(v)
    return v


def frame_text(chars: bytes) -> str:
    return bytes(chars).decode("latin-1")


def cell(v: Any) -> Any:
    """A table cell MLflow can store: conversations as role-prefixed text, a tty frame as its 24 lines."""
    if isinstance(v, bytes):
        return "\n".join(frame_text(v[i:i + 80]) for i in range(0, len(v), 80)) if len(v) == TTY_CELLS else v.hex()
    if isinstance(v, list) and v and isinstance(v[0], dict) and "role" in v[0]:
        v = "\n\n".join(f"[{m['role']}] {m['content']}" for m in v)
    elif isinstance(v, list | dict):
        v = json.dumps(v, default=str)
    v = clean(v)
    return v[:MLFLOW_CELL] if isinstance(v, str) else v


def table_sample(path: Path, rows: int = MLFLOW_ROWS) -> dict[str, list]:
    """``rows`` evenly spaced rows of a dataset's first part, as ``{column: [cells]}`` (empty if none)."""
    manifest = read_manifest(path) or {}
    parts = [p["file"] for _, p in sorted(manifest.get("parts", {}).items())]
    if not parts:
        return {}
    table = pq.read_table(path / parts[0])
    table = table.take(pa.array(sample_indices(table.num_rows, rows), pa.int64()))
    return {c: [cell(v) for v in table[c].to_pylist()] for c in table.column_names
            if not c.endswith("_ids") and not c.endswith("_mask")}  # token ids say nothing in a table


def log_samples(tracker: Any, outs: list[Path]) -> None:
    """Log a few rows of every complete dataset under ``outs`` as ``samples/NAME.json`` MLflow tables."""
    if not tracker.enabled:
        return
    for out in outs:
        for ds in datasets_under(out):
            data = table_sample(ds)
            if data:
                name = ds.name if ds == out else f"{out.name}_{ds.name}"
                tracker.log_table(data, f"samples/{name}.json")
