"""One GRPO round on the hf backend against one on vLLM's server, side by side, on the same tasks and episodes.

    OMP_NUM_THREADS=2 python bench/bench_grpo_backends.py --run DIR [--tasks 8] [--val-tasks 16] [--repeats 1]
    OMP_NUM_THREADS=2 python bench/bench_grpo_backends.py --run DIR \
        --backends hf vllm vllm:VLLM_CPU_NUM_OF_RESERVED_CPU=0

A backend may name environment variables for its server after a colon (``vllm:KEY=VALUE,KEY=VALUE``): vLLM's CPU
engine is configured by them (``VLLM_CPU_NUM_OF_RESERVED_CPU``, ``VLLM_CPU_OMP_THREADS_BIND``), and each such
backend is a row of its own.

``DIR`` is the checkout of a finished run of ``presets/smollm2-learn.yaml`` (its params.yaml and DPO policy;
``make vllm`` first). In a fresh process per backend and repeat (alternating), the DPO policy plays the first
``--tasks`` train tasks of the run (K episodes each, token in / token out, the preset's sampling) through
``pipeline.rl_text.serving.PolicyPlayer``, GRPO updates on them (LoRA, as the preset trains), the round's weights
are saved and served, and ``--val-tasks`` val tasks are played as the val pass plays them. Prints per backend: the
server's start (vLLM), play, update and val seconds, episodes per second, and the sampler / trainer gap.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (every process, /proc/stat), for what a server takes while the
    trainer runs."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def child(run: Path, backend: str, tasks: int, val_tasks: int, out: Path) -> dict:
    import torch
    from peft import get_peft_model

    from pipeline.core.artifacts import chunk_seed
    from pipeline.llm.hf import load_policy
    from pipeline.models import tiny
    from pipeline.models.training import peft_config
    from pipeline.params import load_params
    from pipeline.rl_text import grpo, rounds
    from pipeline.rl_text.rounds import train_jobs
    from pipeline.rl_text.serving import PolicyPlayer
    from pipeline.text.play import play_episodes
    from pipeline.text.policies import make_games

    params = load_params(run / "params.yaml", [f"data_dir={run / 'data'}", "tracking.enabled=false",
                                               f"policy.backend={backend}"])
    games = make_games(params)
    per_group = max(1, tasks // len(games))
    train = train_jobs(params.games, params.rl_text.max_train_tasks, games)
    jobs = [(g, t, s) for g in games for _, t in [j for j in train if j[0] is g][:per_group]
            for s in range(params.rl_text.trajectories_per_task)]
    every_val = rounds.val_jobs_of(params.games, params.rl_text, games)
    val = [(g, t) for g in games for _, t in [v for v in every_val if v[0] is g][
        :max(1, val_tasks // len(games))]]
    dpo = params.data_path("train_policy", "dpo")
    model, tokenizer = load_policy(dpo, params.policy.device)
    player = PolicyPlayer(params.policy, params.rollout_text.batch_size)
    times: dict[str, float] = {}
    try:
        start = time.perf_counter()
        policy = player.backend(dpo, model, tokenizer)
        times["start_s"] = time.perf_counter() - start
        start = time.perf_counter()
        sampling = rounds.round_sampling(params.rl_text.sampling, params.rollout_text.max_new_tokens)
        rows = play_episodes(policy, jobs, sampling, token_ids=True,
                             seed=chunk_seed(params.seed, "bench", 0),
                             max_format_retries=params.rollout_text.max_format_retries)
        times["play_s"] = time.perf_counter() - start
        model = get_peft_model(model, peft_config(params.train_policy.lora, model))
        start, cpu, busy = time.perf_counter(), time.process_time(), busy_cpu_s()
        stats = grpo.update(model, tokenizer, [{**r, "turn_rewards": []} for r in rows],
                            {g.name: g for g in games}, params.rl_text, params.rollout_text.max_new_tokens, 0)
        times["update_s"] = time.perf_counter() - start
        times["update_cpu_s"] = time.process_time() - cpu  # the trainer's own
        times["update_other_cpu_s"] = busy_cpu_s() - busy - times["update_cpu_s"]  # the rest: an idle server's
        model = model.merge_and_unload().eval()
        tiny.save(model, tokenizer, out)
        start = time.perf_counter()
        success = rounds.val_success(params, player.backend(out, model, tokenizer), val)
        times["val_s"] = time.perf_counter() - start
    finally:
        player.close()
    return {**times, "episodes": len(rows), "val_episodes": len(val) * params.rl_text.val_trajectories,
            "replies": stats["grpo/replies"], "val_success": success, "starts": player.starts,
            "gap_mean": stats.get("grpo/mismatch/gap_mean"), "gap_max": stats.get("grpo/mismatch/gap_max"),
            "corrected": stats.get("grpo/mismatch/corrected"), "capability": torch.backends.cpu.get_cpu_capability()}


def backend_spec(text: str) -> str:
    name, _, env = text.partition(":")
    if name not in ("hf", "vllm") or (env and (name != "vllm" or not all("=" in kv for kv in env.split(",")))):
        raise argparse.ArgumentTypeError(f"{text!r}: hf, vllm, or vllm:KEY=VALUE[,KEY=VALUE]")
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="checkout of a finished smollm2-learn run")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--val-tasks", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--backends", nargs="+", default=["hf", "vllm"], type=backend_spec,
                    help="hf, vllm, or vllm:KEY=VALUE[,KEY=VALUE] (the server's environment)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    run = args.run.resolve()
    if args.child:
        with tempfile.TemporaryDirectory(prefix="bench-round-") as tmp:
            print(json.dumps(child(run, args.child, args.tasks, args.val_tasks, Path(tmp) / "round")))
        return 0
    results: dict[str, list[dict]] = {b: [] for b in args.backends}
    for _ in range(args.repeats):
        for backend in args.backends:
            name, _, server_env = backend.partition(":")
            env = dict(kv.split("=", 1) for kv in server_env.split(",")) if server_env else {}
            out = subprocess.run([sys.executable, __file__, "--run", str(run), "--child", name, "--tasks",
                                  str(args.tasks), "--val-tasks", str(args.val_tasks)],
                                 env={**os.environ, "TQDM_DISABLE": "1", **env}, capture_output=True, text=True)
            if out.returncode:
                print(out.stderr[-3000:], file=sys.stderr)
                return out.returncode
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results[backend].append(r)
            print(json.dumps({"backend": backend, **r}), flush=True)
    print("| backend | server start s | play s (episodes/s) | update s (its CPU s / the rest's) | val s (episodes/s) "
          "| gap mean / max | corrected |\n|---|---|---|---|---|---|---|")
    for backend, rs in results.items():
        def med(key: str, rows: list[dict] = rs) -> float:
            return statistics.median(r[key] for r in rows)
        r = rs[0]
        print(f"| {backend} | {med('start_s'):.1f} | {med('play_s'):.1f} ({r['episodes'] / med('play_s'):.2f}) | "
              f"{med('update_s'):.1f} ({med('update_cpu_s'):.0f} / {med('update_other_cpu_s'):.0f}) | "
              f"{med('val_s'):.1f} ({r['val_episodes'] / med('val_s'):.2f}) | "
              f"{r['gap_mean'] or 0:.1e} / {r['gap_max'] or 0:.1e} | {r['corrected'] or 0:.3f} |")
    print(f"cores {os.cpu_count()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(default)')}, CPU kernels "
          f"{results[args.backends[0]][0]['capability']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
