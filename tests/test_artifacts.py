import json

import pytest

from pipeline.core.artifacts import ChunkedDataset, chunk_seed, dataset_hash, read_manifest, read_rows
from pipeline.core.runners import run_chunked


def rows(i):
    return [{"chunk": i, "x": i * 10 + j} for j in range(3)]


def test_run_chunked_writes_parts_and_manifest(tmp_path):
    ds = run_chunked(tmp_path / "d", num_chunks=4, make_chunk=rows, params_hash="p")
    m = read_manifest(ds.path)
    assert m["complete"] and m["num_parts"] == 4 and m["rows"] == 12 and m["params_hash"] == "p"
    assert [r["x"] for r in read_rows(ds.path)] == [0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32]
    assert all(len(p["sha256"]) == 64 for p in m["parts"].values())


def test_resume_keeps_finished_parts_and_recomputes_missing(tmp_path):
    calls = []

    def crashing(i):
        if i == 2:
            raise KeyboardInterrupt  # a kill in the middle of chunk 2
        calls.append(i)
        return rows(i)

    with pytest.raises(KeyboardInterrupt):
        run_chunked(tmp_path / "d", num_chunks=4, make_chunk=crashing, params_hash="p")
    assert not read_manifest(tmp_path / "d")["complete"]
    calls.clear()
    run_chunked(tmp_path / "d", num_chunks=4, make_chunk=lambda i: (calls.append(i), rows(i))[1], params_hash="p")
    assert calls == [2, 3]
    full = run_chunked(tmp_path / "e", num_chunks=4, make_chunk=rows, params_hash="p")
    assert read_rows(tmp_path / "d") == read_rows(full.path)


def test_corrupt_part_is_recomputed(tmp_path):
    run_chunked(tmp_path / "d", num_chunks=3, make_chunk=rows, params_hash="p")
    part = tmp_path / "d" / "part-00001.parquet"
    part.write_bytes(part.read_bytes()[:20])  # truncated
    calls = []
    run_chunked(tmp_path / "d", num_chunks=3, make_chunk=lambda i: (calls.append(i), rows(i))[1], params_hash="p")
    assert calls == [1]
    assert len(read_rows(tmp_path / "d")) == 9


def test_changed_params_recompute_everything_and_drop_stale_files(tmp_path):
    run_chunked(tmp_path / "d", num_chunks=3, make_chunk=rows, params_hash="p")
    (tmp_path / "d" / ".part-00009.parquet.tmp-1").write_bytes(b"half")  # left by a crash
    calls = []
    run_chunked(tmp_path / "d", num_chunks=2, make_chunk=lambda i: (calls.append(i), rows(i))[1], params_hash="q")
    assert calls == [0, 1]
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [
        "_manifest.json", "part-00000.parquet", "part-00001.parquet"]


def test_upstream_change_invalidates(tmp_path):
    run_chunked(tmp_path / "d", num_chunks=2, make_chunk=rows, params_hash="p", upstream={"a": "1"})
    ds = ChunkedDataset(tmp_path / "d", params_hash="p", upstream={"a": "2"})
    assert ds.finished() == set()


def test_dataset_hash_is_content_hash(tmp_path):
    a = run_chunked(tmp_path / "a", num_chunks=2, make_chunk=rows, params_hash="p")
    b = run_chunked(tmp_path / "b", num_chunks=2, make_chunk=rows, params_hash="p")
    c = run_chunked(tmp_path / "c", num_chunks=2, make_chunk=lambda i: rows(i + 1), params_hash="p")
    assert dataset_hash(a.path) == dataset_hash(b.path) != dataset_hash(c.path)
    with pytest.raises(FileNotFoundError):
        dataset_hash(tmp_path / "missing")


def test_chunk_seed_depends_on_all_inputs():
    assert chunk_seed(0, "s", 1) == chunk_seed(0, "s", 1)
    assert len({chunk_seed(0, "s", 1), chunk_seed(1, "s", 1), chunk_seed(0, "t", 1), chunk_seed(0, "s", 2)}) == 4


def test_manifest_is_valid_json_after_each_part(tmp_path):
    seen = []
    run_chunked(tmp_path / "d", num_chunks=3, make_chunk=rows, params_hash="p",
                on_chunk=lambda i: seen.append(json.loads((tmp_path / "d" / "_manifest.json").read_text())["rows"]))
    assert seen == [3, 6, 9]
