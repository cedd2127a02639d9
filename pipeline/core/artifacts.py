"""Chunked, resumable Parquet datasets, and the file manifests of saved models.

A dataset is a directory of Parquet parts (``part-00000.parquet`` …) plus ``_manifest.json``. Each part is
written to a temporary name, fsynced and renamed; the manifest is then replaced atomically. A crash leaves
either a finished part or none. On restart, parts whose recorded sha256 still matches the file and whose
params hash equals the current one are kept; everything else is recomputed. An unreadable manifest (corrupt
JSON, not UTF-8, wrong shape) counts as none: the producer recomputes.

A finished dataset whose params or inputs changed is not touched while the new one is computed: the new
parts go to ``.NAME.next`` beside it, which replaces it only once complete (write aside, then swap).

Consumers (``read_table`` and friends) check every part against the manifest (sha256, Arrow schema) before
use; a mismatch is an ``InputError`` naming the stage to rerun. Saved models get ``_model_manifest.json``
(file → sha256) at save time, checked by ``verify_model`` before a model is loaded.
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

from pipeline.core.errors import DiskFull, InputError, disk_full
from pipeline.core.registry import OUTS, STAGES

SCHEMA_VERSION = 1
MANIFEST = "_manifest.json"
MODEL_MANIFEST = "_model_manifest.json"
_FULL_HASH_BYTES = 64 << 20  # model files up to this size are hashed whole; larger ones: size + both ends


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
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:  # a full disk, a kill: the old file stays whole, the half-written temp goes
        tmp.unlink(missing_ok=True)
        if isinstance(e, Exception) and disk_full(e) is not None:
            raise DiskFull.at(path) from e
        raise
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
    schema: str = ""  # the part's Arrow schema (schema_text); empty in manifests written before it was recorded


def schema_text(schema: pa.Schema) -> str:
    """A schema as one comparable line: ``name: type`` per field, metadata left out."""
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


def producing_stage(path: str | Path) -> str | None:
    """The dvc.yaml stage whose output holds ``path`` (``data/annotate_text`` → ``annotate-text``,
    ``DATA_DIR/train_policy/sft/model.safetensors`` → ``train-sft``): the declared outputs first (the registry's
    ``OUTS``, longest match), then a folder named after a stage."""
    parts = [p.lstrip(".").removesuffix(".next") for p in Path(path).parts]
    joined = "/" + "/".join(parts) + "/"
    for out in sorted(OUTS, key=len, reverse=True):
        if f"/{out}/" in joined:
            return OUTS[out]
    for part in reversed(Path(path).parts):
        name = part.lstrip(".").removesuffix(".next").replace("_", "-")
        if name in STAGES:
            return name
    return None


def _rerun(path: str | Path) -> str:
    stage = producing_stage(path)
    return f"rerun `curio stage {stage}`" if stage else "rerun the stage that writes it"


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
        """Keep only parts that are still valid for the current params; drop the rest.

        A complete dataset of other params / inputs stays in place (readers still see it); this run then works
        in the staging directory beside it, swapped in by :meth:`mark_complete`.
        """
        self.final = self.path
        staging = self.path.with_name(f".{self.path.name}.next")
        if not self.path.exists() and _complete(read_manifest(staging)):
            os.replace(staging, self.path)  # a swap interrupted after the old output was moved away
        manifest = read_manifest(self.path)
        if _complete(manifest) and not self._same_run(manifest):
            self.path = staging
            manifest = read_manifest(self.path)
        elif staging.exists():
            shutil.rmtree(staging)
        self.path.mkdir(parents=True, exist_ok=True)
        if manifest is not None and self._same_run(manifest):
            for key, info in manifest["parts"].items():
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

    def _same_run(self, manifest: dict) -> bool:
        return (
            manifest.get("params_hash") == self.params_hash
            and manifest.get("upstream", {}) == self.upstream
            and manifest.get("schema_version") == self.schema_version
        )

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
        try:
            # zstd where a column repeats across rows (NetHack's tty frames: ~6x smaller than snappy's 64 KiB blocks)
            pq.write_table(table, tmp, compression="zstd" if "tty_chars" in table.column_names else "snappy")
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException as e:  # e.g. a full disk: no half part is left (a rerun would drop it anyway)
            tmp.unlink(missing_ok=True)
            if isinstance(e, Exception) and disk_full(e) is not None:
                raise DiskFull.at(final) from e
            raise
        _fsync_dir(self.path)
        self.parts[index] = PartInfo(file=name, rows=table.num_rows, sha256=file_sha256(final),
                                     schema=schema_text(pq.read_schema(final)))  # as Parquet stores it
        self._write_manifest(complete=False)

    def mark_complete(self, num_parts: int) -> None:
        missing = set(range(num_parts)) - set(self.parts)
        if missing:
            raise RuntimeError(f"{self.path}: parts {sorted(missing)} missing, cannot mark complete")
        for extra in set(self.parts) - set(range(num_parts)):
            (self.path / self.parts.pop(extra).file).unlink(missing_ok=True)
        self.num_parts = num_parts
        self._write_manifest(complete=True)
        if self.path != self.final:  # swap the finished new output in for the old one
            old = self.final.with_name(f".{self.final.name}.old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(self.final, old)
            os.replace(self.path, self.final)
            _fsync_dir(self.final.parent)
            shutil.rmtree(old)
            self.path = self.final

    def fingerprint(self) -> str:
        return dataset_hash(self.path)


def read_manifest(path: str | Path) -> dict | None:
    """The manifest of a dataset directory; None when missing or unreadable (the producer then recomputes)."""
    file = Path(path) / MANIFEST
    try:
        manifest = json.loads(file.read_bytes().decode("utf-8"))
        parts = manifest["parts"]
        for info in parts.values():
            PartInfo(**info)
        int(manifest.get("rows", 0))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # corrupt, not UTF-8, wrong shape
        return None
    return manifest if isinstance(manifest, dict) else None


def _complete(manifest: dict | None) -> bool:
    return manifest is not None and manifest.get("complete") is True


def _complete_manifest(path: str | Path) -> dict:
    manifest = read_manifest(path)
    if manifest is None and (Path(path) / MANIFEST).exists():
        raise InputError(f"{path}: its manifest is unreadable; {_rerun(path)}")
    if not _complete(manifest):
        raise InputError(f"{path}: no complete dataset; {_rerun(path)}")
    assert manifest is not None
    return manifest


def _verify_part(path: Path, info: dict) -> Path:
    """The part's file after checking it against its manifest entry; InputError naming the stage otherwise."""
    file = path / info["file"]
    if not file.is_file():
        raise InputError(f"{file}: missing; {_rerun(path)}")
    if file_sha256(file) != info["sha256"]:
        raise InputError(f"{file}: content does not match its manifest (corrupt or changed); {_rerun(path)}")
    if info.get("schema"):
        try:
            found = schema_text(pq.read_schema(file))
        except (pa.ArrowException, OSError):
            raise InputError(f"{file}: not a readable Parquet file; {_rerun(path)}") from None
        if found != info["schema"]:
            raise InputError(f"{file}: schema {found!r} is not the manifest's; {_rerun(path)}")
    return file


def _read_parquet(file: Path, columns: list[str] | None, path: Path) -> pa.Table:
    try:
        return pq.read_table(file, columns=columns)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{file}: cannot be read ({str(e).splitlines()[0]}); {_rerun(path)}") from None


def dataset_hash(path: str | Path) -> str:
    """Content hash of a finished dataset (from its parts' sha256), used as an upstream hash downstream."""
    manifest = _complete_manifest(path)
    return stable_hash([p["sha256"] for _, p in sorted(manifest["parts"].items())])


def dir_hash(path: str | Path) -> str:
    """Content hash of a directory of files (e.g. a saved model), for upstream hashes of model inputs."""
    path = Path(path)
    if not path.exists():
        return stable_hash(str(path))  # a hub id or a path not on this machine: the name is the identity
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return stable_hash([(str(f.relative_to(path)), file_sha256(f)) for f in files])


def read_table(path: str | Path, columns: list[str] | None = None) -> pa.Table:
    """Read a complete dataset as one Arrow table, parts in index order, each verified against the manifest."""
    path = Path(path)
    manifest = _complete_manifest(path)
    files = [_verify_part(path, p) for _, p in sorted(manifest["parts"].items())]
    tables = [_read_parquet(f, columns, path) for f in files]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="default")


def read_rows(path: str | Path, columns: list[str] | None = None) -> list[dict]:
    return read_table(path, columns).to_pylist()


def read_part(path: str | Path, index: int, columns: list[str] | None = None) -> list[dict]:
    """Rows of one finished part of a dataset, complete or still being written (e.g. by ``run_chunked``: then
    possibly in the staging directory beside a finished older output)."""
    path = Path(path)
    staging = path.with_name(f".{path.name}.next")
    if staging.is_dir():
        path = staging
    part = (read_manifest(path) or {}).get("parts", {}).get(f"{index:05d}")
    if part is None:
        raise InputError(f"{path}: part {index} is not finished; {_rerun(path)}")
    return _read_parquet(_verify_part(path, part), columns, path).to_pylist()


def part_files(path: str | Path) -> list[str]:
    """The verified part files of a complete dataset, for ``datasets.load_dataset('parquet', data_files=...)``."""
    path = Path(path)
    manifest = _complete_manifest(path)
    return [str(_verify_part(path, p)) for _, p in sorted(manifest["parts"].items())]


# -- saved models ------------------------------------------------------------------------------------------
def model_file_hash(file: Path) -> str:
    """sha256 of a model file; above 64 MiB, of its size and first and last MiB (loads stay cheap)."""
    size = file.stat().st_size
    if size <= _FULL_HASH_BYTES:
        return file_sha256(file)
    h = hashlib.sha256(str(size).encode())
    with open(file, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(size - (1 << 20))
        h.update(f.read(1 << 20))
    return "ends:" + h.hexdigest()


def write_model_manifest(directory: str | Path, files: Iterable[str] | None = None) -> None:
    """Record ``files`` (default: every file under ``directory``) with their hashes, for :func:`verify_model`."""
    directory = Path(directory)
    names = sorted(files) if files is not None else sorted(
        str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and p.name != MODEL_MANIFEST)
    atomic_write_json(directory / MODEL_MANIFEST, {name: model_file_hash(directory / name) for name in names})


def verify_model(directory: str | Path) -> None:
    """InputError (one line, naming the stage to rerun) unless the files match the model's manifest.

    Directories without a manifest (a model not saved by Curio, a hub snapshot) and hub ids pass unchecked.
    """
    directory = Path(directory)
    manifest_file = directory / MODEL_MANIFEST
    if not manifest_file.is_file():
        return
    try:
        recorded = json.loads(manifest_file.read_bytes().decode("utf-8"))
        items = list(recorded.items())
    except (OSError, ValueError, AttributeError):
        raise InputError(f"{directory}: its model manifest is unreadable; {_rerun(directory)}") from None
    for name, digest in items:
        file = directory / name
        if not file.is_file():
            raise InputError(f"{file}: missing from the saved model; {_rerun(directory)}")
        if model_file_hash(file) != digest:
            raise InputError(f"{file}: does not match the model's manifest (corrupt or changed); {_rerun(directory)}")


def save_model_dir(directory: str | Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` a model into a directory beside ``directory``, record its manifest, then swap it in:
    the previous model stays whole until the new one is complete."""
    directory = Path(directory)
    staging = directory.with_name(f".{directory.name}.next")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        write(staging)
        write_model_manifest(staging)
    except BaseException:  # e.g. a full disk: the half-written model goes, the previous one stays whole
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = directory.with_name(f".{directory.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if directory.exists():
        os.replace(directory, old)
    os.replace(staging, directory)
    _fsync_dir(directory.parent)
    if old.exists():
        shutil.rmtree(old)


def redo_rows(
    ds: ChunkedDataset,
    column: str,
    value: str,
    fix: Callable[[pa.Table, list[int]], pa.Table],
    schema: pa.Schema | None = None,
) -> int:
    """Rewrite each finished part whose ``column`` equals ``value`` in some rows with ``fix(part, rows)`` (e.g.
    ask an annotator again for its UNKNOWN rows); returns how many rows were redone. Parts are replaced one
    at a time, atomically, so a kill keeps every part whole."""
    redone = 0
    for index in sorted(ds.finished()):
        table = pq.read_table(ds.path / ds.parts[index].file)
        rows = [i for i, v in enumerate(table[column].to_pylist()) if v == value]
        if rows:
            ds.write_part(index, fix(table, rows), schema)
            redone += len(rows)
    return redone


def replace_rows(table: pa.Table, rows: list[int], values: dict[str, list]) -> pa.Table:
    """``table`` with ``values[column][j]`` written into row ``rows[j]`` of each named column."""
    for name, new in values.items():
        column = table[name].to_pylist()
        for i, v in zip(rows, new, strict=True):
            column[i] = v
        index = table.schema.get_field_index(name)
        table = table.set_column(index, table.schema.field(index), pa.array(column, table.schema.field(index).type))
    return table


def chunked(items: Sequence, size: int) -> list[Sequence]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def flatten(groups: Iterable[Iterable]) -> list:
    return [x for g in groups for x in g]
