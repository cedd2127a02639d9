"""A stage's wall time with its MLflow calls in the tracking process (the default) vs in the stage process.

    cd A_FINISHED_CHECKOUT && python bench/bench_tracking.py [--stages pairs-nethack reflogprobs] [--rounds 3]

Run in a checkout whose DAG has run (`make run`): reruns each stage with ``curio stage`` (same inputs, same
outputs), alternating ``CURIO_TRACKING_PROCESS=1`` and ``=0`` so both modes see the same machine, and prints the
median seconds of each and their difference. Each rerun adds runs to the checkout's MLflow store.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def timed(stage: str, process: str) -> float:
    env = {**os.environ, "CURIO_TRACKING_PROCESS": process, "TQDM_DISABLE": "1"}
    curio = Path(sys.executable).with_name("curio")
    t0 = time.perf_counter()
    res = subprocess.run([str(curio), "stage", stage], env=env, capture_output=True, text=True)
    if res.returncode:
        sys.exit(f"curio stage {stage} failed:\n{res.stderr[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", nargs="+", default=["pairs-nethack", "reflogprobs", "train-reward"])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"{'stage':16} {'process (s)':>12} {'in-stage (s)':>13} {'saved (s)':>10}")
    total = [0.0, 0.0]
    for stage in args.stages:
        times: dict[str, list[float]] = {"1": [], "0": []}
        for r in range(args.rounds):
            for process in (("1", "0") if r % 2 == 0 else ("0", "1")):
                times[process].append(timed(stage, process))
        a, b = statistics.median(times["1"]), statistics.median(times["0"])
        total[0] += a
        total[1] += b
        print(f"{stage:16} {a:12.2f} {b:13.2f} {b - a:10.2f}")
    print(f"{'all':16} {total[0]:12.2f} {total[1]:13.2f} {total[1] - total[0]:10.2f}  "
          f"(ratio in-stage / process {total[1] / total[0]:.3f})")


if __name__ == "__main__":
    main()
