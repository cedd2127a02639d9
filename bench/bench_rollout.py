"""Batched vs one-episode-at-a-time rollout throughput with the same policy, measured side by side.

    python bench/bench_rollout.py [--episodes 64] [--policy data/bootstrap/model] [--no-kv-cache] [--threads 1]
    python bench/bench_rollout.py --compare-cache 3

Needs a built policy (run `curio stage bootstrap` first); prints episodes/s of each mode and their ratio, by wall
time and by CPU time (the one to read on a shared machine; ``--threads 1``, the default, keeps torch's idle
threads from counting). ``--no-kv-cache`` re-encodes every conversation each turn (the hf backend's behaviour
before it kept KV caches). ``--compare-cache ROUNDS`` instead plays the batch with the hf backend's ``RoomyCache``
and with transformers' ``DynamicCache`` (its cache before), alternating, and checks the rows are identical.
"""

from __future__ import annotations

import argparse
import time

import torch

from pipeline.config import load_params
from pipeline.llm import sampling_from_config
from pipeline.play import play_episodes
from pipeline.policies import load_policy_backend, make_games


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--policy", default="base")
    ap.add_argument("--no-kv-cache", action="store_true")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's default)")
    ap.add_argument("--compare-cache", type=int, default=0, metavar="ROUNDS",
                    help="batched play with RoomyCache vs DynamicCache, alternating ROUNDS times")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    params = load_params("params.yaml")
    policy = load_policy_backend(params, args.policy, batch_size=args.episodes)
    if args.no_kv_cache:
        policy.kv = None
    game = make_games(params)[0]
    tasks = game.tasks("train")
    jobs = [(game, tasks[i % len(tasks)], 0) for i in range(args.episodes)]
    sampling = sampling_from_config(params.rollout_text, temperature=1.0)  # the rollout sampling, at T=1

    if args.compare_cache:
        compare_cache(policy, jobs, sampling, args.compare_cache)
        return
    t0, c0 = time.perf_counter(), time.process_time()
    batched = play_episodes(policy, jobs, sampling, seed=0)
    t_batched, c_batched = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    sequential = [row for job in jobs for row in play_episodes(policy, [job], sampling, seed=0)]
    t_seq, c_seq = time.perf_counter() - t0, time.process_time() - c0
    turns_b = sum(r["turns"] for r in batched)
    turns_s = sum(r["turns"] for r in sequential)
    print(f"episodes: {args.episodes}  turns batched/sequential: {turns_b}/{turns_s}  torch threads: "
          f"{torch.get_num_threads()}")
    print(f"batched    : {turns_b / t_batched:8.1f} turns/s wall  {turns_b / c_batched:8.1f} turns/CPU s")
    print(f"sequential : {turns_s / t_seq:8.1f} turns/s wall  {turns_s / c_seq:8.1f} turns/CPU s")
    print(f"ratio batched/sequential (turns/s): {(turns_b / t_batched) / (turns_s / t_seq):.2f}x wall, "
          f"{(turns_b / c_batched) / (turns_s / c_seq):.2f}x CPU")


def compare_cache(policy, jobs, sampling, rounds: int) -> None:
    """Batched play with a RoomyCache and with a DynamicCache for every batch, alternating; fresh caches each."""
    import statistics

    from pipeline.llm import hf

    speed: dict[str, list[float]] = {"RoomyCache": [], "DynamicCache": []}
    rows: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for name, min_rows in (("RoomyCache", 2), ("DynamicCache", 10**9)):
            hf.ROOMY_MIN_ROWS = min_rows
            if policy.kv is not None:
                policy.kv = hf.ConversationKV(policy.kv.max_bytes)
            c0 = time.process_time()
            rows[name] = play_episodes(policy, jobs, sampling, seed=0)
            speed[name].append(sum(r["turns"] for r in rows[name]) / (time.process_time() - c0))
    for name, xs in speed.items():
        print(f"{name:<13}: median {statistics.median(xs):7.1f} turns/CPU s  ({', '.join(f'{x:.1f}' for x in xs)})")
    ratio = statistics.median(speed["RoomyCache"]) / statistics.median(speed["DynamicCache"])
    print(f"ratio RoomyCache/DynamicCache: {ratio:.2f}x   rows identical: {rows['RoomyCache'] == rows['DynamicCache']}")


if __name__ == "__main__":
    main()
