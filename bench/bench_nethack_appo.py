"""APPO frames per second with the intrinsic reward vs without, measured side by side in one run.

    python bench/bench_nethack_appo.py [--steps 40000] [--repeats 2] [--reward-model data/reward_model]

"with": Motif's reward (ext 0.1, int 0.1, ε at the 0.5 quantile, β = 3) from the reward model in
``data/reward_model`` (or, when the pipeline has not run yet, a freshly initialised model of the same shape
with a message table from a short random rollout: the cost per step is the same). "without": the same
training with int_coef = 0, i.e. the reward wrapper does no model work. Runs alternate without / with so that
load from other processes hits both alike; each run is a fresh sample-factory experiment with the rl-nethack
stage's default settings. Goal: median FPS with / without ≥ 0.85.
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

import numpy as np

from pipeline.nethack.config import RLNetHackVariant
from pipeline.nethack.sf import SUMMARY, TABLE
from pipeline.params import Params, load_params
from stages.rl_nethack import sf_args

ROOT = Path(__file__).resolve().parents[1]


def stand_in_reward_model(directory: Path) -> None:
    """An untrained reward model with real normalisation stats and a table of real NetHack messages."""
    import torch

    from pipeline.core.artifacts import atomic_write_json
    from pipeline.nethack.play import EnvSpec, StepRecorder, play_random
    from pipeline.nethack.reward import MessageRewardNet, RewardStats, save_reward_model

    torch.manual_seed(0)
    recorder = StepRecorder()
    play_random(EnvSpec("score"), list(range(8)), list(range(8)), on_step=recorder.add)
    messages = list(dict.fromkeys(recorder.messages))
    model = MessageRewardNet()
    raw = model.score(messages)
    mean, std = float(raw.mean()), float(raw.std()) or 1.0
    levels = [round(q, 2) for q in np.linspace(0, 1, 101)]
    stats = RewardStats(mean, std, levels, [float(v) for v in np.quantile((raw - mean) / std, levels)])
    save_reward_model(model, stats, directory)
    atomic_write_json(directory / TABLE, dict(zip(messages, ((raw - mean) / std).tolist(), strict=True)))


def run_once(params: Params, name: str, variant: RLNetHackVariant, reward_dir: Path, train_dir: Path,
             steps: int) -> dict:
    args = sf_args(params, name, variant, train_dir, reward_dir)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log = train_dir / f"{name}.log"
    with open(log, "w") as out:
        code = subprocess.run([sys.executable, "-m", "pipeline.nethack", *args, f"--train_for_env_steps={steps}"],
                              stdout=out, stderr=subprocess.STDOUT, env=env, timeout=900).returncode
    if code != 0:
        raise SystemExit(f"training failed, see {log}")
    return json.loads((train_dir / name / SUMMARY).read_text())


def main() -> None:
    from pipeline.nethack.clock import preload

    preload()  # NetHack's clock pinned (nethack.clock) here and in the processes started below
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40_000, help="env steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="runs per side")
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--reward-model", default=None, help="reward model directory (default: the pipeline's)")
    args = parser.parse_args()

    params = load_params(args.params) if Path(args.params).exists() else Params()
    with tempfile.TemporaryDirectory() as tmp:
        reward_dir = Path(args.reward_model or ROOT / params.data_path("reward_model")).resolve()
        if not (reward_dir / "stats.json").exists():
            reward_dir = Path(tmp) / "reward_model"
            stand_in_reward_model(reward_dir)
            print(f"no trained reward model yet: using an untrained stand-in ({reward_dir})")
        else:
            print(f"reward model: {reward_dir}")
        sides = {
            "without": RLNetHackVariant(ext_coef=0.1, int_coef=0.0),
            "with": RLNetHackVariant(ext_coef=0.1, int_coef=0.1),
        }
        fps: dict[str, list[float]] = {"without": [], "with": []}
        print(f"{'run':>4} {'side':>8} {'env steps':>10} {'FPS':>8}")
        for r in range(args.repeats):
            for side, variant in sides.items():
                summary = run_once(params, f"{side}-{r}", variant, reward_dir, Path(tmp), args.steps)
                fps[side].append(summary["fps"])
                print(f"{r:>4} {side:>8} {summary['env_steps_this_run']:>10} {summary['fps']:>8.0f}", flush=True)
    with_fps, without_fps = statistics.median(fps["with"]), statistics.median(fps["without"])
    print(f"median FPS: with intrinsic reward {with_fps:.0f}, without {without_fps:.0f}")
    print(f"APPO FPS with / without intrinsic reward = {with_fps / without_fps:.3f} (goal >= 0.85)")


if __name__ == "__main__":
    main()
