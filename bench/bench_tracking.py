"""A stage's wall time with its MLflow calls made three ways: in its own tracking process (a stage run alone), in
the stage process, or by the pipeline's tracking service (a stage run under ``make run`` / ``curio pipeline``).

    cd A_FINISHED_CHECKOUT && python bench/bench_tracking.py [--service] [--stages pairs-nethack ...] [--rounds 3]

Run in a checkout whose DAG has run (`make run`): reruns each stage with ``curio stage`` (same inputs, same
outputs), the two sides alternating so both see the same machine, and prints the median seconds of each and their
difference (process − other). Without ``--service``: the tracking process against the calls made in the stage process
(``CURIO_TRACKING_PROCESS=0``). With it: the tracking process against the service, which this script hosts as a
pipeline run does (``pipeline.core.tracking.pipeline_run``). Each rerun adds runs to the checkout's MLflow store.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.core.tracking import PROCESS_ENV, SOCKET_ENV, pipeline_run  # noqa: E402
from pipeline.params import load_params  # noqa: E402


def timed(stage: str, mode: str) -> float:
    env = {**os.environ, "TQDM_DISABLE": "1"}
    if mode != "service":
        env.pop(SOCKET_ENV, None)  # the stage starts its own tracking process, or makes the calls itself
    env[PROCESS_ENV] = "0" if mode == "in-stage" else "1"
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
    ap.add_argument("--service", action="store_true", help="the pipeline's tracking service against the process")
    args = ap.parse_args()
    other = "service" if args.service else "in-stage"
    tracking = load_params("params.yaml").tracking
    hosted = (pipeline_run("bench-tracking", experiment=tracking.experiment, artifact_root=tracking.artifact_root,
                           uri=tracking.uri) if args.service else contextlib.nullcontext())
    print(f"{'stage':16} {'process (s)':>12} {other + ' (s)':>13} {'process − other':>16}")
    total = [0.0, 0.0]
    with hosted:
        for stage in args.stages:
            times: dict[str, list[float]] = {"process": [], other: []}
            for r in range(args.rounds):
                for mode in (("process", other) if r % 2 == 0 else (other, "process")):
                    times[mode].append(timed(stage, mode))
            a, b = statistics.median(times["process"]), statistics.median(times[other])
            total[0] += a
            total[1] += b
            print(f"{stage:16} {a:12.2f} {b:13.2f} {a - b:16.2f}")
    print(f"{'all':16} {total[0]:12.2f} {total[1]:13.2f} {total[0] - total[1]:16.2f}  "
          f"(ratio {other} / process {total[1] / total[0]:.3f})")


if __name__ == "__main__":
    main()
