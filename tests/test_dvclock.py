"""A dvc.lock left unreadable by a kill while DVC wrote it (DVC rewrites it in place): `curio repair-lock` puts back
the copy kept when the last stage started, and DVC runs again (pipeline/core/dvclock.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import REPO, make_project
from conftest import run_in_project as _run

from pipeline.core.dvclock import BROKEN, KEPT, LOCK, readable, repair


def _dvc(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(project),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["dvc", *args], cwd=project, env=env, capture_output=True, text=True, timeout=300)


def _project(tmp_path: Path) -> Path:
    """check-params (a real `curio` stage) and a shell stage after it, run once by `dvc repro`."""
    project = make_project(tmp_path, ["tracking.enabled=false"])
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())
    stages = {"check-params": spec["stages"]["check-params"],
              "after": {"cmd": "cp data/params.ok after.txt", "deps": ["data/params.ok"], "outs": ["after.txt"]}}
    (project / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"]):
        _run(cmd, project)
    assert _dvc(project, "repro", "-q").returncode == 0
    return project


def test_a_dvc_lock_cut_short_is_restored_from_the_copy_kept_when_its_last_stage_started(tmp_path):
    project = _project(tmp_path)
    lock = project / LOCK
    assert not (project / KEPT).exists()  # the first stage found no dvc.lock to keep
    assert _dvc(project, "repro", "-q", "--force", "--single-item", "check-params").returncode == 0
    kept = project / KEPT
    assert kept.exists() and yaml.safe_load(kept.read_text())["stages"].keys() == {"check-params", "after"}

    good = lock.read_text()
    # DVC killed mid-write: the file ends inside the first stage's deps, at "- path" (a string where DVC expects a
    # mapping). A cut at a fixed fraction of the file can end in a prefix that is itself a valid lock, depending
    # on the params' values that stand before it.
    cut = good[: good.index("- path") + len("- path")]
    lock.write_text(cut)
    broken = _dvc(project, "status")
    assert broken.returncode != 0 and "dvc.lock" in broken.stderr + broken.stdout
    assert not readable(lock)

    res = _run(["curio", "repair-lock"], project)
    assert "restored the copy kept" in res and res.count("\n") == 1
    assert (project / BROKEN).read_text() == cut
    assert readable(lock) and yaml.safe_load(lock.read_text()) == yaml.safe_load(kept.read_text())
    status = _dvc(project, "status")
    assert status.returncode == 0, status.stderr
    repro = _dvc(project, "repro")
    assert repro.returncode == 0 and "didn't change, skipping" in repro.stdout  # nothing to redo


def test_an_empty_dvc_lock_without_a_kept_copy_is_moved_aside_and_everything_reruns(tmp_path):
    project = _project(tmp_path)
    (project / LOCK).write_text("")
    assert repair(project).endswith("reruns every stage, each resuming from its saved data")
    assert not (project / LOCK).exists() and (project / BROKEN).exists()
    repro = _dvc(project, "repro")
    assert repro.returncode == 0 and readable(project / LOCK), repro.stdout
    assert yaml.safe_load((project / LOCK).read_text())["stages"].keys() == {"check-params", "after"}
    assert _dvc(project, "status").stdout.strip() == "Data and pipelines are up to date."


def test_a_readable_dvc_lock_is_left_alone(tmp_path):
    project = _project(tmp_path)
    before = (project / LOCK).read_bytes()
    assert repair(project) is None
    assert _run(["curio", "repair-lock"], project).strip() == "curio: dvc.lock is readable: nothing to repair"
    assert (project / LOCK).read_bytes() == before and not (project / BROKEN).exists()
