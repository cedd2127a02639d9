"""NetHack rollout collection (recording every step + Parquet parts) as a ratio to raw NLE stepping.

    python bench/bench_nethack_rollout.py [--episodes 16] [--rounds 3]
    python bench/bench_nethack_rollout.py --compare-frames   # collection with tty frames vs without

Both sides play the same seeded episodes with the same random action stream on the same task, so they make
exactly the same env steps; rounds alternate raw / collect so that load from other processes hits both alike.
Goal: collect / raw ≥ 0.8.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from pipeline.core.artifacts import ChunkedDataset, chunk_seed
from pipeline.nethack.env import seed_env
from pipeline.nethack.play import FRAME_STEP_SCHEMA, STEP_SCHEMA, EnvSpec, StepRecorder, play_random


def raw_stepping(spec: EnvSpec, seeds: list[int]) -> tuple[int, float]:
    """Bare env.step with the same seeded random actions and nothing kept."""
    env = spec.make()
    n_actions = env.action_space.n
    steps = 0
    start = time.perf_counter()
    for seed in seeds:
        seed_env(env, seed)
        rng = np.random.default_rng(seed)
        env.reset()
        actions = rng.integers(n_actions, size=1024)
        t, done = 0, False
        while not done:
            if t and t % len(actions) == 0:
                actions = rng.integers(n_actions, size=1024)
            _, _, terminated, truncated, _ = env.step(int(actions[t % len(actions)]))
            t += 1
            done = terminated or truncated
        steps += t
    elapsed = time.perf_counter() - start
    env.close()
    return steps, elapsed


def collection(spec: EnvSpec, seeds: list[int], dataset: ChunkedDataset, part: int) -> tuple[int, float]:
    """What rollout-nethack does per chunk: play + record every step, then write one Parquet part."""
    start = time.perf_counter()
    recorder = StepRecorder(frames=spec.frames)
    play_random(spec, list(range(len(seeds))), seeds, on_step=recorder.add)
    dataset.write_part(part, recorder.table(), FRAME_STEP_SCHEMA if spec.frames else STEP_SCHEMA)
    elapsed = time.perf_counter() - start
    return len(recorder.step) - len(seeds), elapsed  # rows minus the reset rows = env steps


def main() -> None:
    from pipeline.nethack.clock import preload

    preload()  # NetHack's clock pinned (nethack.clock) here and in the processes started below
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=16, help="episodes per round (each side)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--task", default="score")
    parser.add_argument("--compare-frames", action="store_true",
                        help="collection storing tty frames (what rollout-nethack does) vs without, alternately")
    args = parser.parse_args()
    if args.compare_frames:
        compare_frames(args)
        return

    spec = EnvSpec(args.task, max_episode_steps=5000)
    raw_steps = raw_time = col_steps = col_time = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        dataset = ChunkedDataset(tmp, params_hash="bench")
        # Warm-up, untimed: first-use costs (NLE's shared library, pyarrow's array builders, ~0.3 s once per
        # process) are not a per-step rate.
        warm = [chunk_seed(0, "bench-rollout-warmup", 0)]
        raw_stepping(spec, warm)
        collection(spec, warm, dataset, 999)
        print(f"{'round':>5} {'raw steps/s':>12} {'collect steps/s':>16} {'ratio':>6}")
        for r in range(args.rounds):
            seeds = [chunk_seed(0, "bench-rollout", r * args.episodes + e) for e in range(args.episodes)]
            s1, t1 = raw_stepping(spec, seeds)
            s2, t2 = collection(spec, seeds, dataset, r)
            assert s1 == s2, (s1, s2)  # the same episodes on both sides
            raw_steps, raw_time, col_steps, col_time = raw_steps + s1, raw_time + t1, col_steps + s2, col_time + t2
            print(f"{r:>5} {s1 / t1:>12.0f} {s2 / t2:>16.0f} {(s2 / t2) / (s1 / t1):>6.3f}")
    ratio = (col_steps / col_time) / (raw_steps / raw_time)
    print(f"total: {int(raw_steps)} env steps per side; raw {raw_steps / raw_time:.0f} steps/s, "
          f"collect incl. Parquet {col_steps / col_time:.0f} steps/s")
    print(f"rollout collection / raw NLE stepping = {ratio:.3f} (goal >= 0.8)")


def compare_frames(args: argparse.Namespace) -> None:
    """The same seeded episodes collected without and with tty frames, alternately: steps/s and bytes/step."""
    plain, frames = EnvSpec(args.task, max_episode_steps=5000), EnvSpec(args.task, max_episode_steps=5000, frames=True)
    totals = {False: [0, 0.0, 0], True: [0, 0.0, 0]}
    with tempfile.TemporaryDirectory() as tmp:
        warm = [chunk_seed(0, "bench-rollout-warmup", 0)]
        print(f"{'round':>5} {'plain steps/s':>14} {'frames steps/s':>15} {'ratio':>6}")
        for r in range(args.rounds):
            seeds = [chunk_seed(0, "bench-rollout", r * args.episodes + e) for e in range(args.episodes)]
            rates = {}
            for spec in (plain, frames):
                dataset = ChunkedDataset(f"{tmp}/{spec.frames}", params_hash="bench")
                if r == 0:
                    collection(spec, warm, dataset, 999)
                steps, seconds = collection(spec, seeds, dataset, r)
                size = (dataset.path / f"part-{r:05d}.parquet").stat().st_size
                t = totals[spec.frames]
                t[0], t[1], t[2] = t[0] + steps, t[1] + seconds, t[2] + size
                rates[spec.frames] = steps / seconds
            print(f"{r:>5} {rates[False]:>14.0f} {rates[True]:>15.0f} {rates[True] / rates[False]:>6.3f}")
    (s0, t0, b0), (s1, t1, b1) = totals[False], totals[True]
    print(f"with frames / without: steps/s x{(s1 / t1) / (s0 / t0):.3f}; Parquet bytes per step {b0 / s0:.1f} -> "
          f"{b1 / s1:.1f} (x{(b1 / s1) / (b0 / s0):.1f})")


if __name__ == "__main__":
    main()
