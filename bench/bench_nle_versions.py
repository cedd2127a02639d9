"""NLE's raw stepping speed in two Python environments side by side (e.g. this venv's nle against an older one's).

    python bench/bench_nle_versions.py --other OLD_VENV/bin/python [--steps 30000] [--rounds 5]

Both sides step ``NetHackScore-v0`` (NLE's own task, Curio's observation keys) with the same seeded games and the
same seeded random actions, one process each, in alternating rounds (A B A B …) so that load from other processes
hits both alike. It prints each round's steps/s and the ratio this/other, then the median of each. Only NLE and
gymnasium are imported on either side, so an environment on another NumPy or gymnasium runs it unchanged.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

KEYS = ("glyphs", "chars", "blstats", "message")  # pipeline.nethack.env.OBSERVATION_KEYS


def step(steps: int, seed: int) -> dict:
    """Step NLE ``steps`` times with seeded random actions; the version, steps and seconds."""
    import gymnasium as gym
    import nle
    import numpy as np

    env = gym.make("NetHackScore-v0", observation_keys=KEYS)
    rng = np.random.default_rng(seed)
    actions = rng.integers(env.action_space.n, size=steps)
    game = seed
    env.unwrapped.seed(game, game + 1, reseed=False)
    env.reset()
    start = time.perf_counter()
    for a in actions:
        _, _, terminated, truncated, _ = env.step(int(a))
        if terminated or truncated:
            game += 2
            env.unwrapped.seed(game, game + 1, reseed=False)
            env.reset()
    seconds = time.perf_counter() - start
    env.close()
    return {"nle": nle.__version__, "steps": steps, "seconds": seconds}


def run(python: str, steps: int, seed: int) -> dict:
    out = subprocess.run([python, __file__, "--child", "--steps", str(steps), "--seed", str(seed)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", help="the other environment's python")
    ap.add_argument("--steps", type=int, default=30_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(step(args.steps, args.seed)))
        return
    if not args.other:
        ap.error("--other PYTHON is required")
    this, other, ratios = [], [], []
    for r in range(args.rounds):
        a, b = run(sys.executable, args.steps, args.seed), run(args.other, args.steps, args.seed)
        this.append(a["steps"] / a["seconds"])
        other.append(b["steps"] / b["seconds"])
        ratios.append(this[-1] / other[-1])
        print(f"round {r}: nle {a['nle']} {this[-1]:,.0f} steps/s | nle {b['nle']} {other[-1]:,.0f} steps/s | "
              f"ratio {ratios[-1]:.2f}")
    print(f"median: nle {a['nle']} {statistics.median(this):,.0f} steps/s, nle {b['nle']} "
          f"{statistics.median(other):,.0f} steps/s, ratio {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}; {args.rounds} rounds of {args.steps:,} steps)")


if __name__ == "__main__":
    main()
