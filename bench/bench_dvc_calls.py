"""The Prefect ``pipeline`` flow's DVC bookkeeping for each stage (is it current? record it as run), two ways: the
``dvc`` CLI (``dvc status NAME --json`` and ``dvc commit --force NAME``, a process each) against DVC's API in this
process (:mod:`pipeline.core.dvcrepo`, what the flow uses).

    cd A_FINISHED_CHECKOUT && python bench/bench_dvc_calls.py [--rounds 3] [--stages check-params bootstrap ...]

Run in a checkout whose DAG has run (`make run`): every stage is current, so each question is answered as it is for
a stage the flow skips or has just run, and ``dvc commit --force`` rewrites the ``dvc.lock`` entry it already has
(nothing changes). The two sides alternate, round by round, so both see the same machine; it prints the seconds of
one pass over the stages (each stage asked once and committed once) per side, their medians and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.core import dvcrepo  # noqa: E402
from pipeline.core.dag import dag_order  # noqa: E402


def cli(stages: list[str]) -> float:
    dvc = str(Path(sys.executable).with_name("dvc"))
    t0 = time.perf_counter()
    for name in stages:
        for args in (["status", name, "--json"], ["commit", "--force", name]):
            res = subprocess.run([dvc, *args], capture_output=True, text=True)
            if res.returncode:
                sys.exit(f"dvc {' '.join(args)} failed:\n{res.stderr[-2000:]}")
    return time.perf_counter() - t0


def api(stages: list[str]) -> float:
    t0 = time.perf_counter()
    for name in stages:
        if not dvcrepo.current(name):
            sys.exit(f"{name} is not current: run the DAG first (`make run`)")
        dvcrepo.commit([name])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stages", nargs="+", help="default: every stage of dvc.yaml")
    args = ap.parse_args()
    stages = args.stages or dag_order()
    before = Path("dvc.lock").read_bytes()
    import dvc.repo  # noqa: F401 - loaded once, as in the flow's process (its import is in the first api pass else)

    times: dict[str, list[float]] = {"cli": [], "api": []}
    for r in range(args.rounds):
        for side in (("cli", "api") if r % 2 == 0 else ("api", "cli")):
            times[side].append((cli if side == "cli" else api)(stages))
            print(f"round {r + 1} {side}: {times[side][-1]:.1f} s for {len(stages)} stages", flush=True)
    c, a = statistics.median(times["cli"]), statistics.median(times["api"])
    print(f"median per pass: dvc CLI {c:.1f} s, in-process API {a:.1f} s ({c / a:.2f}x); per stage "
          f"{c / len(stages):.2f} s against {a / len(stages):.2f} s")
    if Path("dvc.lock").read_bytes() != before:
        print("note: dvc.lock differs from before (a stage's outputs changed while it ran?)")


if __name__ == "__main__":
    main()
