"""rl-text with ArCHer: wall time under `accelerate launch` with 2 processes vs 1 process, side by side.

    python bench/bench_archer_processes.py [--rounds 2] [--tasks 16] [--k 4] [--repeats 2]

Builds a small built-in policy first (the bootstrap stage with few episodes, in a temporary directory; it stands
in for the DPO policy rl-text starts from), then runs the rl-text stage (``rl_text.algorithm=archer``) alternately
with ``train_policy.num_processes`` 1 and 2, each run in a fresh data directory (a finished run would be resumed).
Both play ``--rounds × --tasks × --k`` episodes and take the same critic / actor steps on the same global batches;
the 2-process time includes starting the processes (imports, loading the models) — what a user waits for.
Prints each wall time, the 1/2 ratio, the runs' last-round critic losses, and the load average (the machine may be
shared: compare only times printed by one run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WORK = Path(tempfile.mkdtemp(prefix="curio-bench-archer-"))
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} on {os.cpu_count()} cores"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=16, help="train tasks per round")
    ap.add_argument("--k", type=int, default=4, help="episodes per task and round")
    ap.add_argument("--repeats", type=int, default=2, help="alternations of 1 and 2 processes")
    ap.add_argument("--bootstrap-episodes", type=int, default=400)
    args = ap.parse_args()

    import yaml

    from pipeline.core.config import _set_dotted, parse_override
    from pipeline.core.stage import execute
    from pipeline.params import load_params

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    for o in ["tracking.enabled=false", f"bootstrap.episodes={args.bootstrap_episodes}", "bootstrap.epochs=2",
              "rl_text.algorithm=archer", f"rl_text.rounds={args.rounds}", f"rl_text.tasks_per_round={args.tasks}",
              f"rl_text.trajectories_per_task={args.k}", "rl_text.critic.steps=8", "rl_text.critic.batch_size=16",
              "rl_text.archer.actor_steps=2", "rl_text.archer.batch_size=8", "rl_text.archer.warmup_rounds=1"]:
        _set_dotted(raw, *parse_override(o))
    params_file = WORK / "params.yaml"
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    t0 = time.perf_counter()
    execute("bootstrap", load_params(params_file, [f"data_dir={WORK / 'boot'}"]))
    print(f"bootstrap (the policy under test): {time.perf_counter() - t0:.1f} s", flush=True)

    def run(processes: int, n: int) -> tuple[float, float]:
        data = WORK / f"run-{processes}-{n}" / "data"
        (data / "train_policy").mkdir(parents=True)
        (data / "train_policy" / "dpo").symlink_to(WORK / "boot" / "bootstrap" / "model")
        params = load_params(params_file, [f"data_dir={data}", f"metrics_dir={data.parent / 'metrics'}",
                                           f"train_policy.num_processes={processes}"])
        start = time.perf_counter()
        result = execute("rl-text", params)
        return time.perf_counter() - start, result.metrics["rl/critic_loss"]

    print(f"before: {load()}", flush=True)
    times: dict[int, list[float]] = {1: [], 2: []}
    losses: dict[int, list[float]] = {1: [], 2: []}
    for n in range(args.repeats):
        for processes in (1, 2):
            seconds, loss = run(processes, n)
            times[processes].append(seconds)
            losses[processes].append(loss)
            print(f"round {n}: {processes} process(es) {seconds:6.1f} s  critic loss {loss:.5f}  ({load()})",
                  flush=True)
    one, two = statistics.median(times[1]), statistics.median(times[2])
    print(f"\nrl-text ArCHer: {args.rounds} rounds × {args.tasks} tasks × k={args.k} episodes per run")
    print(f"1 process   : median {one:6.1f} s  {[round(t, 1) for t in times[1]]}")
    print(f"2 processes : median {two:6.1f} s  {[round(t, 1) for t in times[2]]}")
    print(f"ratio 1/2: {one / two:.2f}x   last-round critic loss 1 vs 2 processes: {losses[1][0]:.5f} vs "
          f"{losses[2][0]:.5f} (temperature 1: the processes draw other episodes)   after: {load()}")


if __name__ == "__main__":
    main()
