"""`make run`'s runner (pipeline.orchestration.run_dvc): plain `dvc repro`, or with --side-by-side the DAG's independent
branches at the same time, dvc.lock as `dvc repro` leaves it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from pipeline.core.dag import ancestors, branches, dag_order, stage_parents
from pipeline.orchestration import run_dvc

REPO = Path(__file__).resolve().parents[1]

# Two branches, a -> b and c -> d, joined by e. b waits for the file c writes and c for the file a writes: the run
# finishes only if the branches run at the same time (one at a time, b would wait for c forever).
WAIT = ("import sys, time, pathlib; p = pathlib.Path(sys.argv[1]); t = time.time()\n"
        "while not p.exists():\n"
        "    time.sleep(0.05)\n"
        "    if time.time() - t > 60: sys.exit('waited 60 s for ' + str(p))\n")
DVC_YAML = {
    "stages": {
        "a": {"cmd": "python -c 'import pathlib; pathlib.Path(\"out/a\").write_text(\"a\")'",
              "deps": ["src/a.txt"], "outs": ["out/a"]},
        "b": {"cmd": "python wait.py out/c && cat out/a > out/b && date +%s%N >> runs/b",
              "deps": ["out/a", "wait.py"], "outs": ["out/b"]},
        "c": {"cmd": "python wait.py out/a && cat src/c.txt > out/c && date +%s%N >> runs/c",
              "deps": ["src/c.txt", "wait.py"], "outs": ["out/c"]},
        "d": {"cmd": "cat out/c > out/d && date +%s%N >> runs/d && "
                     "python -c 'import os; print(os.sched_getscheduler(0))' > policy_d",
              "deps": ["out/c"], "outs": ["out/d"]},
        "e": {"cmd": "cat out/b out/d > out/e && date +%s%N >> runs/e", "deps": ["out/b", "out/d"],
              "outs": ["out/e"]},
    }
}


def _project(tmp_path: Path, spec: dict = DVC_YAML) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "src/a.txt").write_text("a")
    (tmp_path / "src/c.txt").write_text("c1")
    (tmp_path / "wait.py").write_text(WAIT)
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"]):
        subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True, env=_env())
    return tmp_path


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def _side_by_side(project: Path, capfd) -> tuple[int, str]:
    old, old_path = Path.cwd(), os.environ["PATH"]
    os.chdir(project)
    os.environ["PATH"] = _env()["PATH"]
    try:
        rc = run_dvc.side_by_side()
    finally:
        os.chdir(old)
        os.environ["PATH"] = old_path
    return rc, capfd.readouterr().out


def _runs(project: Path) -> dict[str, int]:
    return {p.name: len(p.read_text().split()) for p in (project / "runs").iterdir()}


def _status(project: Path) -> dict:
    res = subprocess.run(["dvc", "status", "--json"], cwd=project, capture_output=True, text=True, env=_env())
    return json.loads(res.stdout or "{}")


def test_branches_of_the_default_dag():
    parallel, tail = branches(REPO / "dvc.yaml")
    assert tail == ["report"]
    text, nethack = parallel
    assert text[0] == "bootstrap" and text[-1] == "evaluate-text" and "rl-text" in text
    assert nethack == ["rollout-nethack", "annotate-nethack", "pairs-nethack", "train-reward", "rl-nethack",
                       "evaluate-nethack"]
    # check-params, which every stage depends on, is in no branch: `dvc repro` of the longest runs it first
    assert sorted(["check-params", *text, *nethack, *tail]) == sorted(dag_order(REPO / "dvc.yaml"))
    parents = stage_parents(REPO / "dvc.yaml")
    assert not any(ancestors(parents, n) & set(nethack) for n in text)  # no stage of one depends on the other


def test_branches_and_tail_of_a_small_dag(tmp_path):
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(DVC_YAML))
    assert branches(tmp_path / "dvc.yaml") == ([["a", "b"], ["c", "d"]], ["e"])
    # a stage joining only part of the DAG is not a tail: everything is one branch
    spec = {"stages": {k: v for k, v in DVC_YAML["stages"].items() if k != "e"}}
    spec["stages"]["f"] = {"cmd": "true", "deps": ["out/b"], "outs": ["out/f"]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(spec))
    assert branches(tmp_path / "dvc.yaml") == ([["a", "b", "f"], ["c", "d"]], [])


def test_branches_run_side_by_side_and_dvc_lock_is_what_repro_leaves(tmp_path, capfd):
    project = _project(tmp_path)
    rc, out = _side_by_side(project, capfd)
    assert rc == 0, out
    assert (project / "out/e").read_text() == "ac1"
    assert _runs(project) == {"b": 1, "c": 1, "d": 1, "e": 1}
    assert "Running stage 'c' (beside dvc repro)" in out and "Stage 'd' finished in" in out
    assert int((project / "policy_d").read_text()) == os.SCHED_IDLE  # beside: only idle CPU time
    assert _status(project) == {}  # every stage recorded in dvc.lock: `dvc repro` now does nothing
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    assert sorted(lock) == ["a", "b", "c", "d", "e"]

    # a second run runs nothing
    rc, out = _side_by_side(project, capfd)
    assert rc == 0 and _runs(project) == {"b": 1, "c": 1, "d": 1, "e": 1}
    assert "Stage 'c' didn't change, skipping (beside dvc repro)" in out

    # a changed dep of the side branch reruns it, its descendants and the join; the other branch stays
    (project / "src/c.txt").write_text("c2")
    rc, out = _side_by_side(project, capfd)
    assert rc == 0, out
    assert _runs(project) == {"b": 1, "c": 2, "d": 2, "e": 2}
    assert (project / "out/e").read_text() == "ac2"
    assert _status(project) == {}


def test_a_failed_side_stage_fails_the_run_and_keeps_what_finished(tmp_path, capfd):
    spec = yaml.safe_load(yaml.safe_dump(DVC_YAML))
    spec["stages"]["d"]["cmd"] = "echo broken >&2; exit 3"
    project = _project(tmp_path, spec)
    rc, out = _side_by_side(project, capfd)
    assert rc == 3
    assert "ERROR: stage 'd' failed (exit 3; beside dvc repro)" in out and "[d] broken" in out
    status = _status(project)
    assert set(status) == {"d", "e"}  # a, b (dvc repro) and c (committed) are recorded; d and e are not
    assert "e" not in _runs(project)


@pytest.mark.parametrize("argv", [[], ["c"]])
def test_make_run_is_plain_dvc_repro_without_side_by_side(tmp_path, argv):
    project = _project(tmp_path, {"stages": {k: v for k, v in DVC_YAML["stages"].items() if k in "cd"}})
    (project / "out/a").write_text("a")  # c waits for it; nothing runs beside
    (project / "params.yaml").write_text(textwrap.dedent("""\
        tracking:
          enabled: false
    """))
    res = subprocess.run([sys.executable, "-m", "pipeline.orchestration.run_dvc", *argv], cwd=project,
                         capture_output=True, text=True, env={**_env(), "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr
    assert "beside dvc repro" not in res.stdout
    assert _runs(project) == ({"c": 1, "d": 1} if not argv else {"c": 1})
