"""NetHack's clock pinned (nethack.clock): the game sees the pinned date, everything else the real one, and the
NetHack stages write the same rows in two runs and on any date the machine's clock says (a full moon, a Friday the
13th), faked for the whole process by tests/data/system_clock.c (a stand-in for libfaketime)."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import NETHACK_TINY, REPO, curio

from pipeline.core.artifacts import read_table
from pipeline.core.stage import execute
from pipeline.nethack import clock
from pipeline.nethack.env import decode_message, make_env, seed_env
from pipeline.params import load_params

FULL_MOON = "2026-11-24 12:00:00"
FRIDAY_13 = "2026-11-13 12:00:00"
NOTICES = {FULL_MOON: "You are lucky!  Full moon tonight.",
           FRIDAY_13: "Watch out!  Bad things can happen on Friday the 13th."}
WELCOME = "Hello Agent, welcome to NetHack!"


def epoch(date: str) -> int:
    return int(datetime.strptime(date, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp())


@pytest.fixture(scope="module")
def system_clock(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("system_clock") / "system_clock.so"
    subprocess.run([os.environ.get("CC", "gcc"), "-O2", "-shared", "-fPIC", "-o", str(out),
                    str(REPO / "tests" / "data" / "system_clock.c"), "-ldl"], check=True)
    return out


def faked(system_clock: Path, date: str, curio_clock: bool = True) -> dict[str, str]:
    """The environment of a process whose system clock says ``date`` (Curio's library first, when kept)."""
    preload = [os.environ["LD_PRELOAD"]] if curio_clock else []
    return {**os.environ, "LD_PRELOAD": " ".join([*preload, str(system_clock)]), "FAKE_SYSTEM_DATE": str(epoch(date)),
            "PYTHONPATH": str(REPO)}


FIRST_MESSAGE = """
import time
from nle.env.tasks import NetHackScore
env = NetHackScore()
env.seed(1, 2, False)
obs, _ = env.reset()
print(time.time())
print(bytes(obs["message"]).rstrip(b"\\0").decode())
"""


@pytest.mark.parametrize("date", [FULL_MOON, FRIDAY_13])
def test_a_faked_date_reaches_nethack_when_its_clock_is_not_pinned(system_clock, date):
    """The control: without Curio's library the faked date is the game's (its notice replaces the welcome), and
    Python's clock says it too."""
    env = faked(system_clock, date, curio_clock=False)
    out = subprocess.run([sys.executable, "-c", FIRST_MESSAGE], env=env, capture_output=True, text=True, check=True)
    now, message = out.stdout.splitlines()[:2]
    assert abs(float(now) - epoch(date)) < 600
    assert message == NOTICES[date]


def test_nethack_sees_the_pinned_clock_and_nothing_else_does():
    def first_message(pinned: str) -> str:
        env = make_env("score", max_episode_steps=10, clock=pinned)
        seed_env(env, 1)
        obs, _ = env.reset()
        env.close()
        return decode_message(obs["message"])

    try:
        for date, notice in NOTICES.items():
            assert first_message(date) == notice  # whatever today is
            assert clock.pinned() == epoch(date)
    finally:
        assert first_message(clock.DEFAULT_CLOCK).startswith(WELCOME)
    # libc's time() called from anywhere but NetHack (here: Python, through ctypes) is the real clock, the first
    # time from a call site (the library looks its caller up) and after (it keeps the answer per call site)
    libc = ctypes.CDLL(None)
    libc.time.restype = ctypes.c_long
    assert all(abs(libc.time(None) - time.time()) < 5 for _ in range(3))
    assert abs(time.time() - epoch(clock.DEFAULT_CLOCK)) > 365 * 86400


def test_a_bad_clock_param_and_a_missing_library_are_one_line_errors(tmp_path):
    (tmp_path / "params.yaml").write_text("{}\n")
    bad = curio(["stage", "rollout-nethack", "-S", "nethack.clock=tomorrow"], cwd=tmp_path, check=False)
    assert bad.returncode == 2 and "nethack.clock" in bad.stderr and not (tmp_path / "data").exists()
    env = {k: v for k, v in os.environ.items() if k not in {"LD_PRELOAD", "CURIO_NETHACK_CLOCK_REEXEC"}}
    env["CURIO_NETHACK_CLOCK_LIB"] = str(tmp_path / "missing.so")
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "stage", "rollout-nethack", "-S",
                          "tracking.enabled=false", "-S", "rollout_nethack.episodes=1"], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "NetHack's clock cannot be pinned" in lines[0] and "make nethack-clock" in lines[0]


RUN_STAGES = """
import json, sys
from pipeline.params import load_params
from pipeline.core.stage import execute
params = load_params(sys.argv[1], json.loads(sys.argv[2]))
for name in ("rollout-nethack", "evaluate-nethack"):
    execute(name, params)
"""


def test_rollout_and_evaluate_rows_are_identical_in_two_runs_and_on_any_date(tmp_path, system_clock):
    """rollout-nethack and evaluate-nethack (a random policy and a trained checkpoint) twice, then in processes
    whose system clock says full moon and Friday the 13th: the same rows every time."""
    common = [*NETHACK_TINY, "rl_nethack.variants={extrinsic: {ext_coef: 0.1, int_coef: 0.0}}",
              "rl_nethack.train_for_env_steps=512", "evaluate_nethack.policies=[random, extrinsic]"]
    (tmp_path / "params.yaml").write_text("{}\n")
    trained = load_params(tmp_path / "params.yaml", [*common, f"data_dir={tmp_path / 'trained'}"])
    execute("rl-nethack", trained)

    def overrides(run: str) -> list[str]:
        data = tmp_path / run / "data"
        data.mkdir(parents=True)
        (data / "rl_nethack").symlink_to(trained.data_path("rl_nethack"))
        return [*common, f"data_dir={data}"]

    runs = {}
    for run in ("first", "second"):
        runs[run] = load_params(tmp_path / "params.yaml", overrides(run))
        for name in ("rollout-nethack", "evaluate-nethack"):
            execute(name, runs[run])
    for run, date in (("full_moon", FULL_MOON), ("friday_13", FRIDAY_13)):
        argv = overrides(run)
        out = subprocess.run([sys.executable, "-c", RUN_STAGES, str(tmp_path / "params.yaml"), json.dumps(argv)],
                             env=faked(system_clock, date), capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[run] = load_params(tmp_path / "params.yaml", argv)

    rollouts = {run: read_table(p.data_path("rollout_nethack")) for run, p in runs.items()}
    evaluations = {run: read_table(p.data_path("evaluate_nethack")) for run, p in runs.items()}
    first = rollouts["first"].to_pylist()
    assert first[0]["message"].startswith(WELCOME) and len(first) > 100
    assert set(evaluations["first"]["policy"].to_pylist()) == {"random", "extrinsic"}
    for run in ("second", "full_moon", "friday_13"):
        assert rollouts[run].equals(rollouts["first"]), run
        assert evaluations[run].equals(evaluations["first"]), run
    shutil.rmtree(tmp_path / "trained" / "rl_nethack", ignore_errors=True)


def test_the_bench_scripts_build_the_library_as_the_makefile_does(tmp_path):
    """compile_library (`curio bench fresh-clone --venv`, bench/bench_nethack_clock.py) uses the Makefile recipe's
    flags, and what it builds exports the library's entry points."""
    recipe = [line for line in (REPO / "Makefile").read_text().splitlines() if "-shared" in line]
    assert len(recipe) == 1 and f"{{CC:-gcc}} {' '.join(clock.CFLAGS)} -o $@ $< -ldl" in recipe[0]
    built = ctypes.CDLL(str(clock.compile_library(REPO / "pipeline" / "nethack" / "clock.c", tmp_path / "c.so")))
    built.curio_nethack_clock_get.restype = ctypes.c_longlong
    assert built.curio_nethack_clock_get() == -1  # nothing pinned in a library just loaded
