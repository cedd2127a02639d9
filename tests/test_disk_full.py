"""A full disk (ENOSPC) at each write path: one line, exit 2, nothing half-written trusted, and after space
returns the rerun resumes to the same result as an uninterrupted run.

The error is injected where the bytes are written (a Parquet part, a manifest, a checkpoint marker, an HF
checkpoint, the LLM cache, MLflow), and once for real on a 1 MiB tmpfs when this process may mount one (root).
CLI cases run in-process (typer's CliRunner on ``pipeline.cli.app``) on a scratch project as in test_bad_inputs.
"""

from __future__ import annotations

import builtins
import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pipeline import cli
from pipeline.core import artifacts
from pipeline.core.artifacts import MANIFEST, read_manifest, read_table, save_model_dir
from pipeline.core.checkpoints import finished, mark_finished
from pipeline.core.errors import DiskFull, disk_full
from pipeline.llm.base import Generation
from pipeline.llm.cache import ResponseCache

sys.path.insert(0, str(Path(__file__).parent))
from test_bad_inputs import ROLLOUT_SCHEMA, rollout_rows, write_dataset  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def enospc(path: object = None) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path) if path is not None else None)


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """cwd = a project with params.yaml (tracking off) and a hand-made data/rollout_text of 24 games; annotate-text
    writes one part per 8 rows."""
    import stages.annotate_text

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["tracking"]["enabled"] = False
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    write_dataset(tmp_path / "data" / "rollout_text", rollout_rows(24), ROLLOUT_SCHEMA)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CURIO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(stages.annotate_text, "ROWS_PER_CHUNK", 8)
    return tmp_path


@pytest.fixture
def uninterrupted(project, tmp_path_factory) -> list[dict]:
    """annotate-text's rows from a run nobody interrupted (in a copy of the project)."""
    copy = tmp_path_factory.mktemp("straight")
    shutil.copytree(project / "data", copy / "data")
    res = run(["stage", "annotate-text", "-S", f"data_dir={copy / 'data'}", "-S", f"metrics_dir={copy / 'metrics'}"])
    assert res.exit_code == 0, res.stderr
    return read_table(copy / "data" / "annotate_text").to_pylist()


def run(args: list[str]):
    return CliRunner().invoke(cli.app, args)


def assert_disk_full_line(result, *needles: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("curio: disk full"), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def no_temp_files(root: Path) -> None:
    left = [p for p in root.rglob("*") if ".tmp-" in p.name or p.name.endswith(".next")]
    assert not left, left


class Failing:
    """``open`` for artifacts' writes: the n-th write whose file name matches fails half-way with ENOSPC."""

    def __init__(self, match, after: int = 0) -> None:
        self.match, self.after, self.seen, self.failed = match, after, 0, False

    def __call__(self, file, mode="r", *args, **kwargs):
        f = builtins.open(file, mode, *args, **kwargs)
        if "w" not in mode or not self.match(Path(file).name):
            return f
        self.seen += 1
        if self.seen <= self.after:
            return f
        self.failed = True
        real_write = f.write

        def write(data):
            real_write(data[: len(data) // 2])  # half of it lands, as when the disk fills mid-write
            raise enospc(file)

        f.write = write
        return f


# -- each write path, through the CLI -----------------------------------------------------------------------
def test_a_full_disk_while_writing_a_part(project, uninterrupted, monkeypatch):
    real = artifacts.pq.write_table
    calls = []

    def write_table(table, where, **kw):
        calls.append(where)
        if len(calls) == 2:  # the second part: one part is finished before the disk fills
            Path(where).write_bytes(b"PAR1 half a part")
            raise enospc(where)
        return real(table, where, **kw)

    monkeypatch.setattr(artifacts.pq, "write_table", write_table)
    out = project / "data" / "annotate_text"
    assert_disk_full_line(run(["stage", "annotate-text"]), "data/annotate_text/part-00001.parquet")
    no_temp_files(project / "data")
    manifest = read_manifest(out)
    assert manifest is not None and not manifest["complete"] and len(manifest["parts"]) == 1  # only the whole part
    monkeypatch.setattr(artifacts.pq, "write_table", real)  # space is back
    calls.clear()
    monkeypatch.setattr(artifacts.pq, "write_table", lambda t, w, **kw: calls.append(w) or real(t, w, **kw))
    assert run(["stage", "annotate-text"]).exit_code == 0
    assert len(calls) == 2  # resumed: the finished part was kept, the other two written
    assert read_table(out).to_pylist() == uninterrupted


def test_a_full_disk_while_writing_a_manifest(project, uninterrupted, monkeypatch):
    failing = Failing(lambda name: name.startswith(f".{MANIFEST}.tmp-"), after=3)
    monkeypatch.setattr(artifacts, "open", failing, raising=False)  # artifacts' writes go through it
    out = project / "data" / "annotate_text"
    assert_disk_full_line(run(["stage", "annotate-text"]), MANIFEST)
    assert failing.failed
    no_temp_files(project / "data")
    manifest = read_manifest(out)
    assert manifest is not None and not manifest["complete"]  # the previous manifest, whole
    monkeypatch.delattr(artifacts, "open")
    assert run(["stage", "annotate-text"]).exit_code == 0
    assert read_table(out).to_pylist() == uninterrupted


def test_a_full_disk_while_writing_the_metrics_file(project, uninterrupted, monkeypatch):
    """The stage's last write (metrics/stages/NAME.json): the dataset is complete, the metrics file absent; the
    rerun writes it without recomputing a part."""
    monkeypatch.setattr(artifacts, "open", Failing(lambda name: name.startswith(".annotate-text.json.tmp-")),
                        raising=False)
    assert_disk_full_line(run(["stage", "annotate-text"]), "annotate-text.json")
    assert not (project / "metrics" / "stages" / "annotate-text.json").exists()
    no_temp_files(project)
    monkeypatch.delattr(artifacts, "open")
    real, calls = artifacts.pq.write_table, []
    monkeypatch.setattr(artifacts.pq, "write_table", lambda t, w, **kw: calls.append(w) or real(t, w, **kw))
    assert run(["stage", "annotate-text"]).exit_code == 0
    assert calls == [] and read_table(project / "data" / "annotate_text").to_pylist() == uninterrupted
    assert json.loads((project / "metrics" / "stages" / "annotate-text.json").read_text())["trajectories"] == 24


def test_a_full_disk_in_mlflow_is_one_line(project, monkeypatch):
    """MLflow's calls made in this process (CURIO_TRACKING_PROCESS=0): an artifact upload hitting ENOSPC."""
    from pipeline.core import tracking

    def log_artifact(self, path, artifact_path=None):
        raise enospc(Path("mlartifacts") / Path(path).name)

    monkeypatch.setenv(tracking.PROCESS_ENV, "0")
    monkeypatch.setattr(tracking.Calls, "log_artifact", log_artifact)
    res = run(["stage", "annotate-text", "-S", "tracking.enabled=true",
               "-S", f"tracking.uri=sqlite:///{project / 'mlflow.db'}"])
    assert res.exit_code == 2, (res.stderr, res.exception)
    ours = [line for line in res.stderr.splitlines() if line.startswith("curio:")]  # MLflow logs its own INFO lines
    assert len(ours) == 1 and ours[0].startswith("curio: disk full writing mlartifacts"), res.stderr
    assert "Traceback" not in res.stderr


def test_the_mlflow_process_reports_a_full_disk_by_its_exit_status(monkeypatch, caplog):
    """In the tracking process a full disk is exit status DISK_FULL_EXIT (no traceback); the stage process turns
    that into DiskFull."""
    from pipeline.core import tracking

    def setup(*a, **kw):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(tracking, "_setup", setup)
    msg = json.dumps({"op": "setup", "experiment": "e", "artifact_root": "a", "uri": None})
    assert tracking._serve(iter([msg + "\n"])) == tracking.DISK_FULL_EXIT
    assert "Traceback" not in caplog.text

    class Done:
        class stdin:  # noqa: N801 - the attribute of a Popen
            @staticmethod
            def close():
                pass

        def wait(self):
            return tracking.DISK_FULL_EXIT

    t = tracking.StageTracking(enabled=False)
    t.proc = Done()  # type: ignore[assignment]
    with pytest.raises(DiskFull, match="MLflow"):
        t.close(None)


# -- checkpoints, saved models, the LLM cache --------------------------------------------------------------
def test_a_half_written_done_marker_is_never_trusted(tmp_path, monkeypatch):
    monkeypatch.setattr(artifacts, "open", Failing(lambda name: name.startswith(".DONE.tmp-")), raising=False)
    with pytest.raises(DiskFull, match="DONE"):
        mark_finished(tmp_path, "key")
    assert not (tmp_path / "DONE").exists() and not finished(tmp_path, "key")
    monkeypatch.delattr(artifacts, "open")
    mark_finished(tmp_path, "key")
    assert finished(tmp_path, "key")


def test_a_model_cut_short_by_a_full_disk_leaves_the_old_one(tmp_path):
    model = tmp_path / "data" / "bootstrap" / "model"
    save_model_dir(model, lambda d: (d / "weights.bin").write_bytes(b"old"))

    def full(d: Path) -> None:
        (d / "weights.bin").write_bytes(b"ha")
        raise enospc(d / "weights.bin")

    with pytest.raises(OSError):
        save_model_dir(model, full)
    assert (model / "weights.bin").read_bytes() == b"old"
    assert not (model.parent / ".model.next").exists()  # the half-saved copy is gone (space freed)


def test_an_hf_checkpoint_cut_short_is_not_resumed(tmp_path):
    """The Trainer writes trainer_state.json last: a checkpoint without a readable one (a full disk mid-save) is
    removed and the one before it resumed."""
    from pipeline.models.training import _last_checkpoint

    for step in (2, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (tmp_path / "checkpoint-6").mkdir()
    (tmp_path / "checkpoint-6" / "model.safetensors").write_bytes(b"half")  # no trainer_state.json
    (tmp_path / "checkpoint-8").mkdir()
    (tmp_path / "checkpoint-8" / "trainer_state.json").write_text('{"global_st')  # cut mid-write
    assert _last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2", "checkpoint-4"]


def test_a_full_llm_cache_is_disk_full_and_keeps_what_it_had(tmp_path):
    """SQLite's own "database or disk is full" (SQLITE_FULL, made real with max_page_count): DiskFull naming the
    cache, which is neither moved aside nor damaged; with space back, writes go on."""
    path = tmp_path / "llm-cache.sqlite"
    cache = ResponseCache(path)
    cache.put_many({"k0": Generation(text="kept")})
    conn = cache._conn()
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")  # this connection may not grow the file
    with pytest.raises(DiskFull, match=str(path)):
        cache.put_many({f"k{i}": Generation(text="x" * 2000) for i in range(1, 50)})
    conn.execute("PRAGMA max_page_count = 1073741823")  # space is back
    assert cache.get_many(["k0", "k1"]).keys() == {"k0"}
    cache.put_many({"k1": Generation(text="new")})
    assert set(cache.get_many(["k0", "k1"])) == {"k0", "k1"}
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_disk_full_is_found_however_a_library_wraps_it():
    try:
        try:
            raise enospc("/data/x")
        except OSError as inner:
            raise RuntimeError("task failed") from inner
    except RuntimeError as outer:
        found = disk_full(outer)
    assert found is not None and "/data/x" in str(found)
    assert disk_full(RuntimeError("other")) is None
    assert disk_full(OSError(errno.EACCES, "denied")) is None


# -- for real: a 1 MiB tmpfs ---------------------------------------------------------------------------------
def _mount_tmpfs(where: Path, size: str) -> str | None:
    """None when mounted, else why not."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    where.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                         text=True)
    return None if res.returncode == 0 else f"mount -t tmpfs not permitted here: {res.stderr.strip()}"


def test_a_really_full_disk_then_the_rerun(project, uninterrupted, tmp_path):
    """data_dir on a 1 MiB tmpfs nearly filled: annotate-text runs out of space for real (ENOSPC from the kernel),
    exits 2 in one line; once the filler is deleted, the rerun completes with the uninterrupted run's rows."""
    mnt = tmp_path / "small"
    why = _mount_tmpfs(mnt, "1m")
    if why:
        pytest.skip(why)
    try:
        shutil.copytree(project / "data", mnt / "data")
        filler = mnt / "filler"
        with open(filler, "wb", buffering=0) as f:  # fill it up, then give back a page: room for a manifest only
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC
        os.truncate(filler, max(0, filler.stat().st_size - 4096))
        sets = ["-S", f"data_dir={mnt / 'data'}", "-S", f"metrics_dir={mnt / 'metrics'}"]
        assert_disk_full_line(run(["stage", "annotate-text", *sets]), str(mnt))
        no_temp_files(mnt / "data")
        manifest = read_manifest(mnt / "data" / "annotate_text")
        assert manifest is None or not manifest["complete"]
        filler.unlink()  # space is back
        res = run(["stage", "annotate-text", *sets])
        assert res.exit_code == 0, res.stderr
        assert read_table(mnt / "data" / "annotate_text").to_pylist() == uninterrupted
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
