"""The real-model preset's two kinds of work on this CPU, with its own kernels and with AVX2's, side by side.

    OMP_NUM_THREADS=2 python bench/bench_grpo_isa.py --run DIR [--tasks 6] [--repeats 1] [--isa native avx2]

``DIR`` is the checkout of a finished run of ``presets/smollm2-learn.yaml`` (its params.yaml, its DPO policy and
rl-text's first round of episodes). In a fresh process per ``--isa`` (alternating, ``--repeats`` times) it times:

- **play**: the first ``--tasks`` tasks of rl-text's first round played again by the DPO policy (their K episodes
  each, the preset's batch, sampling and ``policy.*`` settings: what rollout-text, the val passes and
  evaluate-text do);
- **update**: GRPO's update (``pipeline.rl_text.grpo.update``, LoRA as the preset trains) on those episodes as they were
  played: what each round trains.

``avx2`` caps torch's, oneDNN's and MKL's kernels at AVX2 (``curio bench fresh-clone``'s ``AVX2_ENV``), as on an
AVX2-only machine; the clock, caches and memory stay this machine's. Prints each side's seconds (median over the
repeats) and avx2 ÷ native per kind of work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pipeline.tools.fresh_clone import AVX2_ENV  # the one definition of the cap

REPO = Path(__file__).resolve().parents[1]


def child(run: Path, tasks: int) -> dict:
    """One side's timings, in this process (the ISA was fixed by its environment before torch loaded)."""
    import torch

    from pipeline.core.artifacts import chunk_seed, read_part
    from pipeline.llm import sampling_from_config
    from pipeline.llm.hf import HFBackend, load_policy
    from pipeline.models.training import peft_config
    from pipeline.params import load_params
    from pipeline.rl_text.grpo import update
    from pipeline.rl_text.rounds import episode_jobs, train_jobs
    from pipeline.text.curriculum import task_key
    from pipeline.text.play import play_episodes
    from pipeline.text.policies import make_games

    params = load_params(run / "params.yaml", [f"data_dir={run / 'data'}", "tracking.enabled=false"])
    rows = read_part(params.data_path("rl_text", "rollouts"), 0)
    keys = list(dict.fromkeys((r["group"], r["task_id"]) for r in rows))[:tasks]
    rows = [r for r in rows if (r["group"], r["task_id"]) in set(keys)]
    game_list = make_games(params)
    games = {g.name: g for g in game_list}
    keyed = [(task_key(r["group"], r["task_id"]), r["sample"]) for r in rows]
    jobs = episode_jobs(train_jobs(params.games, params.rl_text.max_train_tasks, game_list), keyed)
    dpo = params.data_path("train_policy", "dpo")
    model, tokenizer = load_policy(dpo, params.policy.device)
    policy = HFBackend(dpo, batch_size=params.rollout_text.batch_size, model_obj=model, tokenizer=tokenizer,
                       drop_finished=params.policy.drop_finished, dtype=params.policy.dtype,
                       cpu_linear=params.policy.cpu_linear)
    start = time.perf_counter()
    played = play_episodes(policy, jobs, sampling_from_config(params.rollout_text),
                           seed=chunk_seed(params.seed, "bench", 0), policy_name="bench",
                           max_format_retries=params.rollout_text.max_format_retries, token_ids=True)
    play_s = time.perf_counter() - start
    if params.rl_text.lora:
        from peft import get_peft_model

        model = get_peft_model(model, peft_config(params.train_policy.lora, model))
    start = time.perf_counter()
    stats = update(model, tokenizer, rows, games, params.rl_text, params.rollout_text.max_new_tokens, 0)
    update_s = time.perf_counter() - start
    return {"play_s": play_s, "episodes": len(played), "update_s": update_s, "replies": stats["grpo/replies"],
            "capability": torch.backends.cpu.get_cpu_capability()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, type=Path, help="checkout of a finished smollm2-learn run")
    ap.add_argument("--tasks", type=int, default=6, help="tasks of rl-text's first round (K episodes each)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--isa", nargs="+", default=["native", "avx2"], choices=["native", "avx2"])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.run.resolve(), args.tasks)))
        return 0
    results: dict[str, list[dict]] = {isa: [] for isa in args.isa}
    for _ in range(args.repeats):
        for isa in args.isa:
            env = {**os.environ, "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1", **(AVX2_ENV if isa == "avx2" else {})}
            out = subprocess.run([sys.executable, __file__, "--child", "--run", str(args.run), "--tasks",
                                  str(args.tasks)], env=env, capture_output=True, text=True, cwd=REPO)
            if out.returncode:
                print(out.stderr[-3000:], file=sys.stderr)
                return out.returncode
            results[isa].append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = results[isa][-1]
            print(f"{isa:<7} ({r['capability']}): play {r['play_s']:.1f} s ({r['episodes']} episodes), "
                  f"update {r['update_s']:.1f} s ({r['replies']} replies)", flush=True)
    first = args.isa[0]
    for kind in ("play_s", "update_s"):
        med = {isa: statistics.median(r[kind] for r in rs) for isa, rs in results.items()}
        ratios = "  ".join(f"{isa}/{first} {med[isa] / med[first]:.2f}" for isa in args.isa[1:])
        print(f"{kind[:-2]:<7} " + "  ".join(f"{isa} {med[isa]:.1f} s" for isa in args.isa) + f"  {ratios}")
    print(f"cores {os.cpu_count()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(default)')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
