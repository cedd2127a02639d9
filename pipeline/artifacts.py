"""Chunked, resumable Parquet datasets.

A dataset is a directory of Parquet parts (``part-00000.parquet`` …) plus ``_manifest.json``. Each part is
written to a temporary name, fsynced and renamed; the manifest is then replaced atomically. A crash leaves
either a finished part or none. On restart, parts whose recorded sha256 still matches the file and whose
params hash equals the current one are kept; everything else is recomputed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA_VERSION = 1
MANIFEST = "_manifest.json"


def stable_hash(obj: Any) -> str:
    """sha256 of a JSON-serialisable object, key order independent."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def chunk_seed(seed: int, stage: str, index: int) -> int:
    """Seed of one chunk, derived from (global seed, stage, chunk index) only."""
    digest = hashlib.sha256(f"{seed}/{stage}/{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a fsynced temp file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


def rows_to_table(rows: Sequence[dict] | pa.Table, schema: pa.Schema | None = None) -> pa.Table:
    if isinstance(rows, pa.Table):
        return rows if schema is None else rows.cast(schema)
    if schema is not None:
        return pa.Table.from_pylist(list(rows), schema=schema)
    return pa.Table.from_pylist(list(rows))


@dataclass
class PartInfo:
    file: str
    rows: int
    sha256: str


class ChunkedDataset:
    """A directory of Parquet parts with a manifest; the unit of resume."""

    def __init__(
        self,
        path: str | Path,
        *,
        params_hash: str,
        upstream: dict[str, str] | None = None,
        schema_version: int = SCHEMA_VERSION,
    ) -> None:
        self.path = Path(path)
        self.params_hash = params_hash
        self.upstream = dict(upstream or {})
        self.schema_version = schema_version
        self.parts: dict[int, PartInfo] = {}
        self.num_parts: int | None = None
        self._load()

    # -- manifest ---------------------------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    def _load(self) -> None:
        """Keep only parts that are still valid for the current params; drop the rest."""
        self.path.mkdir(parents=True, exist_ok=True)
        manifest = read_manifest(self.path)
        same_run = (
            manifest is not None
            and manifest.get("params_hash") == self.params_hash
            and manifest.get("upstream", {}) == self.upstream
            and manifest.get("schema_version") == self.schema_version
        )
        if same_run:
            for key, info in manifest.get("parts", {}).items():
                part = PartInfo(**info)
                file = self.path / part.file
                if file.exists() and file_sha256(file) == part.sha256:
                    self.parts[int(key)] = part
        # Anything on disk that is not a valid part of this run is stale: remove it so it is never read.
        keep = {p.file for p in self.parts.values()}
        for child in self.path.iterdir():
            if child.name == MANIFEST:
                continue
            if child.name not in keep:
                if child.is_dir():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        self._write_manifest(complete=False)

    def _write_manifest(self, complete: bool) -> None:
        atomic_write_json(
            self.manifest_path,
            {
                "schema_version": self.schema_version,
                "params_hash": self.params_hash,
                "upstream": self.upstream,
                "num_parts": self.num_parts,
                "complete": complete,
                "rows": sum(p.rows for p in self.parts.values()),
                "parts": {f"{i:05d}": vars(p) for i, p in sorted(self.parts.items())},
            },
        )

    # -- parts ------------------------------------------------------------------------------------------
    def finished(self) -> set[int]:
        return set(self.parts)

    def write_part(self, index: int, rows: Sequence[dict] | pa.Table, schema: pa.Schema | None = None) -> None:
        table = rows_to_table(rows, schema)
        name = f"part-{index:05d}.parquet"
        final = self.path / name
        tmp = self.path / f".{name}.tmp-{os.getpid()}"
        pq.write_table(table, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.path)
        self.parts[index] = PartInfo(file=name, rows=table.num_rows, sha256=file_sha256(final))
        self._write_manifest(complete=False)

    def mark_complete(self, num_parts: int) -> None:
        missing = set(range(num_parts)) - set(self.parts)
        if missing:
            raise RuntimeError(f"{self.path}: parts {sorted(missing)} missing, cannot mark complete")
        for extra in set(self.parts) - set(range(num_parts)):
            (self.path / self.parts.pop(extra).file).unlink(missing_ok=True)
        self.num_parts = num_parts
        self._write_manifest(complete=True)

    def fingerprint(self) -> str:
        return dataset_hash(self.path)


def read_manifest(path: str | Path) -> dict | None:
    file = Path(path) / MANIFEST
    if not file.exists():
        return None
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError:
        return None


def dataset_hash(path: str | Path) -> str:
    """Content hash of a finished dataset (from its parts' sha256), used as an upstream hash downstream."""
    manifest = read_manifest(path)
    if manifest is None or not manifest.get("complete"):
        raise FileNotFoundError(f"{path}: no complete dataset (run its stage first)")
    return stable_hash([p["sha256"] for _, p in sorted(manifest["parts"].items())])


def dir_hash(path: str | Path) -> str:
    """Content hash of a directory of files (e.g. a saved model), for upstream hashes of model inputs."""
    path = Path(path)
    if not path.exists():
        return stable_hash(str(path))  # a hub id or a path not on this machine: the name is the identity
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return stable_hash([(str(f.relative_to(path)), file_sha256(f)) for f in files])


def read_table(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    """Read a complete dataset as one Arrow table, parts in index order."""
    path = Path(path)
    manifest = read_manifest(path)
    if manifest is None or not manifest.get("complete"):
        raise FileNotFoundError(f"{path}: no complete dataset (run its stage first)")
    files = [path / p["file"] for _, p in sorted(manifest["parts"].items())]
    tables = [pq.read_table(f, columns=columns) for f in files]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="default")


def read_rows(path: str | Path, columns: list[str] | None = None) -> list[dict]:
    return read_table(path, columns).to_pylist()


def read_part(path: str | Path, index: int, columns: list[str] | None = None) -> list[dict]:
    """Rows of one finished part of a dataset, complete or still being written (e.g. by ``run_chunked``)."""
    manifest = read_manifest(path)
    part = (manifest or {}).get("parts", {}).get(f"{index:05d}")
    if part is None:
        raise FileNotFoundError(f"{path}: part {index} is not finished")
    return pq.read_table(Path(path) / part["file"], columns=columns).to_pylist()


def part_files(path: str | Path) -> list[str]:
    """The part files of a complete dataset, for ``datasets.load_dataset('parquet', data_files=...)``."""
    manifest = read_manifest(path)
    if manifest is None or not manifest.get("complete"):
        raise FileNotFoundError(f"{path}: no complete dataset (run its stage first)")
    return [str(Path(path) / p["file"]) for _, p in sorted(manifest["parts"].items())]


def run_chunked(
    path: str | Path,
    *,
    num_chunks: int,
    make_chunk: Callable[[int], Sequence[dict] | pa.Table],
    params_hash: str,
    upstream: dict[str, str] | None = None,
    schema: pa.Schema | None = None,
    desc: str = "chunks",
    on_chunk: Callable[[int], None] | None = None,
) -> ChunkedDataset:
    """Compute the missing chunks of a dataset (resuming), then mark it complete.

    ``make_chunk(index)`` must be deterministic given the index (derive its seed with :func:`chunk_seed`).
    """
    from tqdm.auto import tqdm

    ds = ChunkedDataset(path, params_hash=params_hash, upstream=upstream)
    todo = [i for i in range(num_chunks) if i not in ds.finished()]
    with tqdm(total=num_chunks, initial=num_chunks - len(todo), desc=desc, unit="chunk") as bar:
        for index in todo:
            ds.write_part(index, make_chunk(index), schema)
            bar.update(1)
            if on_chunk is not None:
                on_chunk(index)
    ds.mark_complete(num_chunks)
    return ds


def chunked(items: Sequence, size: int) -> list[Sequence]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def flatten(groups: Iterable[Iterable]) -> list:
    return [x for g in groups for x in g]
