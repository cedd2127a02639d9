"""Batched vs one-episode-at-a-time rollout throughput with the same policy, measured side by side.

    python bench/bench_rollout.py [--episodes 64] [--rounds 8] [--policy data/bootstrap/model] [--no-kv-cache]
                                  [--threads 1]
    python bench/bench_rollout.py --compare cache|sampler|kept [--rounds 3]

Needs a built policy (run `curio stage bootstrap` first); prints turns/s of each mode and their ratio, by wall
time and by CPU time (the one to read on a shared machine; ``--threads 1``, the default, keeps torch's idle
threads from counting). After an untimed warm-up of each, the modes alternate in ``--rounds`` short windows, each
starting from an empty KV store: a machine whose speed drifts then slows both alike. ``--no-kv-cache`` re-encodes
every conversation each turn (the hf backend's behaviour before it kept KV caches).

``--compare cache|sampler|kept`` instead plays the batch with the hf backend as it is and with one speed-up
undone, alternating ``--rounds`` times: cache = its ``RoomyCache`` vs transformers' ``DynamicCache``; sampler =
its ``GumbelSampler`` vs transformers' ``torch.multinomial`` (the same distribution, other draws); kept = kept
keys / values left in the batch's cache until the next call vs copied out at once.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from pipeline.llm import hf, sampling_from_config
from pipeline.params import load_params
from pipeline.text.play import play_episodes
from pipeline.text.policies import load_policy_backend, make_games


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--policy", default="base")
    ap.add_argument("--no-kv-cache", action="store_true")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's default)")
    ap.add_argument("--rounds", type=int, default=8,
                    help="alternate the modes in this many windows (each sequential window plays 1/rounds)")
    ap.add_argument("--compare", choices=sorted(COMPARE),
                    help="batched play with one speed-up of the hf backend and without, alternating --rounds times")
    ap.add_argument("--compare-cache", type=int, default=0, metavar="ROUNDS", help="= --compare cache --rounds N")
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
        args.compare, args.rounds = "cache", args.compare_cache
    if args.compare:
        compare(policy, jobs, sampling, args.compare, args.rounds)
        return
    timed_play(policy, jobs, sampling), timed_play(policy, jobs[:1], sampling, one_at_a_time=True)  # warm-up
    # The two modes alternate in short windows (a batched play of every episode, then 1/rounds of the episodes
    # one at a time), so a machine whose speed drifts slows both alike; each mode's figure pools its windows.
    totals = {"batched": [0, 0.0, 0.0], "sequential": [0, 0.0, 0.0]}
    per_round = []
    chunk = -(-len(jobs) // args.rounds)
    for r in range(args.rounds):
        speeds = {}
        for mode, batch in (("batched", jobs), ("sequential", jobs[r * chunk : (r + 1) * chunk])):
            if not batch:
                continue
            rows, wall, cpu = timed_play(policy, batch, sampling, one_at_a_time=mode == "sequential")
            turns = sum(row["turns"] for row in rows)
            for i, x in enumerate((turns, wall, cpu)):
                totals[mode][i] += x
            speeds[mode] = turns / cpu
        if len(speeds) == 2:
            per_round.append(speeds["batched"] / speeds["sequential"])
    (turns_b, t_b, c_b), (turns_s, t_s, c_s) = totals["batched"], totals["sequential"]
    print(f"episodes: {args.episodes}  rounds: {args.rounds}  turns batched/sequential: {turns_b}/{turns_s}  "
          f"torch threads: {torch.get_num_threads()}")
    print(f"batched    : {turns_b / t_b:8.1f} turns/s wall  {turns_b / c_b:8.1f} turns/CPU s")
    print(f"sequential : {turns_s / t_s:8.1f} turns/s wall  {turns_s / c_s:8.1f} turns/CPU s")
    print(f"ratio batched/sequential (turns/s): {(turns_b / t_b) / (turns_s / t_s):.2f}x wall, "
          f"{(turns_b / c_b) / (turns_s / c_s):.2f}x CPU  (per round, CPU: median {statistics.median(per_round):.2f}x, "
          f"{min(per_round):.2f}-{max(per_round):.2f}x)")


def timed_play(policy, batch: list, sampling, one_at_a_time: bool = False) -> tuple[list[dict], float, float]:
    """Play ``batch`` (together, or one episode at a time) from an empty KV store, as a rollout starts: the rows,
    wall seconds and CPU seconds."""
    if policy.kv is not None:
        policy.kv = hf.ConversationKV(policy.kv.max_bytes)
    t0, c0 = time.perf_counter(), time.process_time()
    if one_at_a_time:
        rows = [row for job in batch for row in play_episodes(policy, [job], sampling, seed=0)]
    else:
        rows = play_episodes(policy, batch, sampling, seed=0)
    return rows, time.perf_counter() - t0, time.process_time() - c0


@contextlib.contextmanager
def variant(name: str):
    """The hf backend as it is, or with one of its speed-ups swapped for what it replaced."""
    saved = hf.ROOMY_MIN_ROWS, hf.sampler_for, hf.ConversationKV.store
    try:
        if name == "DynamicCache":  # transformers' cache for every batch: each decode step concatenates
            hf.ROOMY_MIN_ROWS = 10**9
        elif name == "multinomial":  # transformers' sampler: torch.multinomial over the whole vocabulary
            hf.sampler_for = lambda config, sampling: None
        elif name == "copied-out":  # each row's keys / values copied out of the batch cache as it is stored

            def store(self, conversation, reply, entry, replaces=None):
                entry.materialize()
                saved[2](self, conversation, reply, entry, replaces)

            hf.ConversationKV.store = store
        yield
    finally:
        hf.ROOMY_MIN_ROWS, hf.sampler_for, hf.ConversationKV.store = saved


COMPARE = {"cache": ("RoomyCache", "DynamicCache"), "sampler": ("GumbelSampler", "multinomial"),
           "kept": ("in-batch", "copied-out")}


def compare(policy, jobs, sampling, what: str, rounds: int) -> None:
    """Batched play with the current hf backend and with one speed-up undone, alternating; fresh KV stores."""
    names = COMPARE[what]
    speed: dict[str, list[float]] = {name: [] for name in names}
    rows: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for name in names:
            with variant(name):
                rows[name], _, cpu = timed_play(policy, jobs, sampling)
            speed[name].append(sum(r["turns"] for r in rows[name]) / cpu)
    for name, xs in speed.items():
        print(f"{name:<13}: median {statistics.median(xs):7.1f} turns/CPU s  ({', '.join(f'{x:.1f}' for x in xs)})")
    ratio = statistics.median(speed[names[0]]) / statistics.median(speed[names[1]])
    same = rows[names[0]] == rows[names[1]]
    print(f"ratio {names[0]}/{names[1]}: {ratio:.2f}x   rows identical: {same}"
          + ("  (expected: the same distribution, other random draws)" if what == "sampler" else ""))


if __name__ == "__main__":
    main()
