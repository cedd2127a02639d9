"""What ``reproducible: portable`` costs: stages run with this CPU's own kernels and with the portable ones, side by
side, alternating (native, portable, portable, native, ...), each stage a ``curio stage`` process of its own.

    python bench/bench_portable.py [--stages bootstrap evaluate-text] [--rounds 2] [-S key=value ...] [--keep DIR]

Each round runs the stages in order from an empty data directory per side (bootstrap trains the built-in model from
scratch, evaluate-text plays the held-out tasks with it: the default run's largest training stage and its largest
play), with the checkout's params.yaml, MLflow off and ``evaluate_text.policies=[base]``. Prints each stage's wall
seconds and CPU seconds (user + system, its processes together) per side, their medians and the ratio portable ÷
native, and whether each round's two sides trained the same model. ``threads`` stays at its params value on the
native side; the portable side takes portable's (2 when null): on a 2-core machine the two are the same count.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.core.artifacts import dir_hash  # noqa: E402
from pipeline.core.kernels import PORTABLE_ENV  # noqa: E402

MODES = ("native", "portable")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_stage(stage: str, mode: str, data: Path, overrides: list[str]) -> tuple[float, float]:
    """One ``curio stage`` process; its wall and CPU seconds."""
    env = {k: v for k, v in os.environ.items() if k not in PORTABLE_ENV}  # native: this CPU's own kernels
    env["TQDM_DISABLE"] = "1"
    sets = ["tracking.enabled=false", "evaluate_text.policies=[base]", f"data_dir={data}",
            f"metrics_dir={data}/metrics", f"reproducible={mode}", *overrides]
    curio = Path(sys.executable).with_name("curio")
    cpu0, t0 = children_cpu(), time.perf_counter()
    res = subprocess.run([str(curio), "stage", stage, *(f"-S{s}" for s in sets)], env=env, capture_output=True,
                         text=True)
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    if res.returncode:
        sys.exit(f"curio stage {stage} ({mode}) failed:\n{res.stderr[-3000:]}")
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", nargs="+", default=["bootstrap", "evaluate-text"])
    ap.add_argument("--rounds", type=int, default=2, help="rounds; each runs both sides, the first side alternating")
    ap.add_argument("-S", "--set", dest="overrides", action="append", default=[], help="a params override")
    ap.add_argument("--keep", type=Path, help="keep each side's data here (default: a temporary directory)")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-portable-"))
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    print(f"cores {os.cpu_count()}, stages {' '.join(args.stages)}, {args.rounds} rounds, data under {root}")
    for r in range(args.rounds):
        models = {}
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            data = root / f"round{r}-{mode}"
            for stage in args.stages:
                wall, cpu = run_stage(stage, mode, data, args.overrides)
                times.setdefault((stage, mode), []).append((wall, cpu))
                print(f"round {r} {mode:8} {stage:14} wall {wall:7.1f} s  cpu {cpu:7.1f} s", flush=True)
            models[mode] = dir_hash(data / "bootstrap" / "model")
        print(f"round {r}: the two sides' models are {'the same' if len(set(models.values())) == 1 else 'different'}")
    print(f"\n{'stage':14} {'native wall':>11} {'portable wall':>13} {'ratio':>6} {'native cpu':>10} "
          f"{'portable cpu':>12} {'ratio':>6}")
    totals = {mode: [0.0, 0.0] for mode in MODES}
    for stage in args.stages:
        med = {m: [statistics.median(t[i] for t in times[(stage, m)]) for i in (0, 1)] for m in MODES}
        for m in MODES:
            totals[m] = [totals[m][0] + med[m][0], totals[m][1] + med[m][1]]
        print(f"{stage:14} {med['native'][0]:11.1f} {med['portable'][0]:13.1f} "
              f"{med['portable'][0] / med['native'][0]:6.2f} {med['native'][1]:10.1f} {med['portable'][1]:12.1f} "
              f"{med['portable'][1] / med['native'][1]:6.2f}")
    n, p = totals["native"], totals["portable"]
    print(f"{'all (medians)':14} {n[0]:11.1f} {p[0]:13.1f} {p[0] / n[0]:6.2f} {n[1]:10.1f} {p[1]:12.1f} "
          f"{p[1] / n[1]:6.2f}")


if __name__ == "__main__":
    main()
