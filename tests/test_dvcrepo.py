"""pipeline.core.dvcrepo (DVC's API in-process, as the Prefect pipeline flow asks it) answers as the ``dvc`` CLI does:
which stages ``dvc status`` flags, and ``dvc commit --force`` leaving the ``dvc.lock`` the CLI leaves."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import run_in_project

from pipeline.core import dvcrepo

DVC_YAML = {"stages": {
    "a": {"cmd": "cp src/a.txt out/a", "deps": ["src/a.txt"], "outs": ["out/a"]},
    "b": {"cmd": "cp out/a out/b", "deps": ["out/a"], "outs": ["out/b"]},
}}


def _dvc(project: Path, *args: str) -> str:
    return run_in_project(["dvc", *args], project)


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(DVC_YAML, sort_keys=False))
    _dvc(tmp_path, "init", "--no-scm", "-q")
    _dvc(tmp_path, "config", "core.analytics", "false")
    monkeypatch.chdir(tmp_path)  # the repository the flow asks about is the one it runs in
    return tmp_path


def test_status_and_current_are_what_dvc_status_says(project):
    for step in ("never run", "a ran", "a changed"):
        if step == "a ran":
            _dvc(project, "repro", "a")
        if step == "a changed":
            (project / "src" / "a.txt").write_text("a2")
        cli = json.loads(_dvc(project, "status", "--json") or "{}")
        assert dvcrepo.status() == cli, step
        for name in ("a", "b"):
            assert dvcrepo.current(name) == (name not in cli), (step, name)
    assert set(cli) == {"a", "b"} and dvcrepo.status(["a"]) == {"a": cli["a"]}


def test_commit_leaves_the_lock_dvc_commit_leaves_and_prints_nothing(project, tmp_path_factory, capfd):
    for name in ("a", "b"):  # the stages' work done by hand, as the flow does it (execute), then recorded
        (project / "out" / name).write_text("a")
    twin = tmp_path_factory.mktemp("twin")
    for path in ("src", "out", "dvc.yaml", ".dvc"):
        (shutil.copytree if (project / path).is_dir() else shutil.copy)(project / path, twin / path)
    capfd.readouterr()
    dvcrepo.commit(["a", "b"])
    assert capfd.readouterr() == ("", "")  # DVC's "Updating lock file" is its CLI's line
    _dvc(twin, "commit", "--force", "a", "b")
    assert yaml.safe_load((project / "dvc.lock").read_text()) == yaml.safe_load((twin / "dvc.lock").read_text())
    assert dvcrepo.status() == {} and dvcrepo.current("b")


def test_no_repository_or_an_unknown_stage(project, tmp_path_factory, monkeypatch):
    with pytest.raises(RuntimeError, match="dvc commit nope failed: 'nope' does not exist"):
        dvcrepo.commit(["nope"])
    monkeypatch.chdir(tmp_path_factory.mktemp("nowhere"))
    assert dvcrepo.status() is None and dvcrepo.current("a") is False  # no repository: DVC cannot tell


def test_dvc_reads_the_projects_yaml_with_the_c_parser_and_the_same_data():
    """DVC's YAML reader (``dvc.utils.serialize.parse_yaml``: ruamel.yaml, typ="safe") gets ruamel's C parser from
    the installed stack, and it reads the project's dvc.yaml and params.yaml as the pure-Python parser does."""
    from dvc.utils.serialize import parse_yaml
    from ruamel.yaml import YAML
    from ruamel.yaml.main import CParser

    assert CParser is not None, "ruamel.yaml.clib is not installed: DVC parses YAML in pure Python"
    assert YAML(typ="safe").Parser is CParser
    repo = Path(__file__).resolve().parents[1]
    for name in ("dvc.yaml", "params.yaml"):
        text = (repo / name).read_text()
        assert parse_yaml(text, name) == YAML(typ="safe", pure=True).load(text), name
