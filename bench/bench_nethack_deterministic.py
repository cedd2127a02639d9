"""APPO frames per second with ``rl_nethack.deterministic: true`` vs the default mode, side by side in one run.

    python bench/bench_nethack_deterministic.py [--steps 20000] [--repeats 2]

Both sides train the extrinsic-only agent (no reward model work) with the rl-nethack stage's other settings,
each run a fresh sample-factory experiment; runs go default, deterministic, deterministic, default, … so that
load from other processes hits both alike. "deterministic": serial mode, synchronous sampling and learning
(``async_rl`` off), one worker, torch's deterministic algorithms, seeded NetHack games. Prints the FPS of every
run and the ratio of the medians (deterministic / default).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.nethack.clock import preload
from pipeline.nethack.config import RLNetHackVariant
from pipeline.nethack.sf import SUMMARY
from pipeline.params import Params, load_params
from stages.rl_nethack import sf_args

ROOT = Path(__file__).resolve().parents[1]


def run_once(params: Params, train_dir: Path, steps: int) -> dict:
    variant = RLNetHackVariant(ext_coef=0.1, int_coef=0.0, reward="none")
    args = sf_args(params, "extrinsic", variant, train_dir, train_dir / "no_reward_model")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    train_dir.mkdir(parents=True, exist_ok=True)
    log = train_dir / "train.log"
    with open(log, "w") as out:
        code = subprocess.run([sys.executable, "-m", "pipeline.nethack", *args, f"--train_for_env_steps={steps}"],
                              stdout=out, stderr=subprocess.STDOUT, env=env, timeout=1800).returncode
    if code != 0:
        raise SystemExit(f"training failed, see {log}")
    return json.loads((train_dir / "extrinsic" / SUMMARY).read_text())


def main() -> None:
    preload()  # NetHack's clock pinned here and in the trainers started below
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="runs per side")
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    args = parser.parse_args()

    base = load_params(args.params) if Path(args.params).exists() else Params()
    sides = {
        "default": base.model_copy(update={"rl_nethack": base.rl_nethack.model_copy(update={"deterministic": False})}),
        "deterministic": base.model_copy(
            update={"rl_nethack": base.rl_nethack.model_copy(update={"deterministic": True})}),
    }
    fps: dict[str, list[float]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            # ABBA order: a load that rises or falls during the bench hits both sides alike
            for name, params in (sides.items() if r % 2 == 0 else reversed(sides.items())):
                summary = run_once(params, Path(tmp) / f"{name}-{r}", args.steps)
                fps[name].append(summary["fps"])
                print(f"{name:>13} run {r}: {summary['fps']:8.1f} FPS ({summary['env_steps_this_run']} env steps in "
                      f"{summary['seconds_this_run']:.1f} s)", flush=True)
    medians = {name: statistics.median(v) for name, v in fps.items()}
    print(f"median FPS: default {medians['default']:.1f}, deterministic {medians['deterministic']:.1f}")
    print(f"deterministic / default = {medians['deterministic'] / medians['default']:.2f}")


if __name__ == "__main__":
    main()
