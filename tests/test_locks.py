"""Two runs at once, as real processes: a second `curio stage X` while X runs is refused at once (exit 2, one line
naming the running process's pid and command), or waits for it with --wait; a second `curio pipeline` likewise; a
lock dies with its process (SIGKILL included), so it is never left stale.

The first run is a real `curio stage annotate-text` (on a small hand-made rollout, tracking off) whose ``run`` is
held open until the test releases it: tests/lock_holder.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.core.locks import LOCK_DIR, hold

sys.path.insert(0, str(Path(__file__).parent))
from test_bad_inputs import ROLLOUT_SCHEMA, rollout_rows, write_dataset  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HOLDER = Path(__file__).with_name("lock_holder.py")


@pytest.fixture
def project(tmp_path) -> Path:
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["tracking"]["enabled"] = False
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    write_dataset(tmp_path / "data" / "rollout_text", rollout_rows(16), ROLLOUT_SCHEMA)
    return tmp_path


def env(project: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1", "CURIO_CACHE_DIR": str(project / "cache"),
            "CURIO_WAIT": ""}


def start_holder(project: Path) -> subprocess.Popen:
    """A real `curio stage annotate-text`, paused inside the stage's run until ``project/release`` exists."""
    proc = subprocess.Popen([sys.executable, str(HOLDER), "stage", "annotate-text"], cwd=project, env=env(project),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while not (project / "started").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the first run never reached its stage's run"
        time.sleep(0.2)
    return proc


def curio(project: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=project, env=env(project),
                          capture_output=True, text=True, timeout=600, **kw)


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("curio: ") and "Traceback" not in stderr, stderr
    return lines[0]


def test_a_second_run_of_a_running_stage_is_refused_then_waits_when_asked(project):
    first = start_holder(project)
    try:
        t0 = time.time()
        second = curio(project, "stage", "annotate-text")
        refused_in = time.time() - t0
        assert second.returncode == 2, (second.stdout, second.stderr)
        line = one_line(second.stderr)
        assert f"pid {first.pid}" in line and "stage annotate-text" in line and "--wait" in line, line

        waiting = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "stage", "annotate-text", "--wait"],
                                   cwd=project, env=env(project), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        time.sleep(2)
        assert waiting.poll() is None  # it waits (the first still runs)
        (project / "release").touch()
        assert first.wait(timeout=600) == 0, first.communicate()
        out, err = waiting.communicate(timeout=600)
        assert waiting.returncode == 0, err
        assert f"waiting for pid {first.pid}" in err, err
    finally:
        (project / "release").touch()
        if first.poll() is None:
            first.kill()
    print(f"refused in {refused_in:.1f} s (process start included)")


def test_a_lock_dies_with_its_process(project):
    first = start_holder(project)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=60)
    res = curio(project, "stage", "annotate-text")  # SIGKILLed holder: its locks went with it
    assert res.returncode == 0, res.stderr


def test_a_second_pipeline_is_refused(project):
    """`curio pipeline` holds data_dir's pipeline lock; a second one is refused before Prefect even starts."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pipeline.core.locks import hold\n"
         "with hold(sys.argv[1], ['pipeline'], 'curio pipeline'):\n"
         "    open(sys.argv[2], 'w').close(); time.sleep(600)", str(project / "data"), str(project / "held")],
        cwd=project, env=env(project))
    try:
        deadline = time.time() + 120
        while not (project / "held").exists():
            assert holder.poll() is None and time.time() < deadline
            time.sleep(0.1)
        res = curio(project, "pipeline")
        assert res.returncode == 2, res.stderr
        line = one_line(res.stderr)
        assert f"pid {holder.pid}" in line and "curio pipeline" in line, line
    finally:
        holder.kill()
        holder.wait()


def test_outputs_lock_in_their_data_dir(tmp_path):
    """Locks live in DATA_DIR/.locks: runs on other data directories never wait for each other."""
    with hold(tmp_path / "a", ["train_policy/sft"], "x"), hold(tmp_path / "b", ["train_policy/sft"], "x"):
        assert (tmp_path / "a" / LOCK_DIR / "train_policy+sft.owner").is_file()
    assert not (tmp_path / "a" / LOCK_DIR / "train_policy+sft.owner").exists()
