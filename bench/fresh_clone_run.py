"""The default DAG as a new user runs it: a fresh clone, the venv build, `make run`; per-stage seconds.

    python bench/fresh_clone_run.py [--ref HEAD] [--avx2] [--venv PATH] [--keep DIR] [--budget-min 12] [--side-by-side]
                                    [--no-warm]

Clones this checkout (``git clone`` of ``--ref``, committed work only) into a temp dir, builds the venv with the
Makefile's own recipe (or symlinks ``--venv`` to skip the build and time the DAG alone, with the clone's own NetHack
clock library built beside it), runs the default DAG
(``python -m pipeline.run_dvc``, what ``make run`` runs) and prints each stage's seconds (a stage `dvc repro` runs:
from the moment dvc starts it to the next stage's start; a stage run beside it: its own wall time), the venv
build, the headline ``make run`` prints (``dvc metrics show``), the total and the budget. ``--avx2`` caps the
instruction set of torch's three kernel libraries at AVX2, as on an AVX2-only machine: ``ATEN_CPU_CAPABILITY=avx2``
(torch's own kernels), ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN: ``policy.cpu_linear: onednn``, convolutions) and
``MKL_ENABLE_INSTRUCTIONS=AVX2`` (MKL's GEMM, torch's matmul). The clock, caches and memory stay this machine's.
``--no-warm``: every stage command loads its own libraries (``CURIO_WARM=0``, no warm start: pipeline/stage_server.py).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline.nethack.clock import LIBRARY_ENV, compile_library

REPO = Path(__file__).resolve().parents[1]
# What --avx2 sets: every kernel library torch dispatches to, capped at AVX2.
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
AVX2_TEXT = " ".join(f"{k}={v}" for k, v in AVX2_ENV.items())
STAGE_LINE = re.compile(r"^Running stage '([^']+)':")  # dvc repro's own (the stages of its branch, in order)
SIDE_DONE = re.compile(r"Stage '([^']+)' finished in ([0-9.]+) s \(beside dvc repro\)")  # pipeline.run_dvc's
MAIN_DONE = re.compile(r"^dvc repro .*: done in")
WAIT = "(waiting for branches beside, dvc commit)"


def timed_dag(cwd: Path, env: dict[str, str], log, side_by_side: bool = False) -> tuple[dict[str, float], float, int]:
    """Run the DAG, streaming its output to ``log``; per-stage seconds, the total, and the exit code.

    A stage ``dvc repro`` runs counts from its "Running stage" line to the next one (or to the end of that
    ``dvc repro``); a stage run beside it (``pipeline.run_dvc``) counts its own wall time, and is marked so.
    """
    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    current, started = None, t0
    cmd = [str(cwd / ".venv/bin/python"), "-m", "pipeline.run_dvc", *(["--side-by-side"] if side_by_side else [])]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        # a line printed beside dvc repro's may follow a progress bar's last redraw on the same line
        m, side, done = STAGE_LINE.match(line), SIDE_DONE.search(line), MAIN_DONE.match(line)
        if side:
            stages[f"{side.group(1)} (beside)"] = float(side.group(2))
        elif m or done:
            now = time.perf_counter()
            if current is not None:
                stages[current] = now - started
            current, started = (m.group(1) if m else WAIT), now
    rc = proc.wait()
    end = time.perf_counter()
    if current is not None:
        stages[current] = end - started
    return stages, end - t0, rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="HEAD", help="commit of this checkout to clone (default HEAD)")
    ap.add_argument("--avx2", action="store_true",
                    help=f"torch's, oneDNN's and MKL's kernels capped at AVX2 ({AVX2_TEXT})")
    ap.add_argument("--venv", help="reuse this venv instead of building one (the venv build is then not timed)")
    ap.add_argument("--keep", help="clone into this directory and keep it (default: a temp dir, removed)")
    ap.add_argument("--budget-min", type=float, default=12.0)
    ap.add_argument("--side-by-side", action="store_true", help="the DAG's branches at the same time "
                    "(python -m pipeline.run_dvc --side-by-side), not make run's one stage at a time")
    ap.add_argument("--no-warm", action="store_true", help="no warm start: each stage command loads torch, "
                    "transformers and Curio itself (CURIO_WARM=0)")
    args = ap.parse_args()

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="curio-bench-run-"))
    work = root / "curio"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONUNBUFFERED"] = "1"  # dvc's "Running stage" lines must arrive when printed: they time the stages
    if args.avx2:
        env.update(AVX2_ENV)
    if args.no_warm:
        env["CURIO_WARM"] = "0"
    try:
        subprocess.run(["git", "clone", "-q", str(REPO), str(work)], check=True)
        subprocess.run(["git", "checkout", "-q", args.ref], cwd=work, check=True)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=work, check=True,
                                capture_output=True, text=True).stdout.strip()
        t0 = time.perf_counter()
        if args.venv:
            (work / ".venv").symlink_to(Path(args.venv).resolve())
            # a shared venv's editable install points elsewhere: make the clone's code win, and its NetHack clock
            # library (the shared venv's is built from another checkout's clock.c): built as `make nethack-clock`
            # builds it, into the clone
            env["PYTHONPATH"] = str(work)
            (work / ".cache").mkdir(exist_ok=True)
            env[LIBRARY_ENV] = str(compile_library(work / "pipeline/nethack/clock.c",
                                                   work / ".cache" / "curio_nethack_clock.so"))
            build = None
        else:
            subprocess.run(["make", "install"], cwd=work, env=env, check=True)
            build = time.perf_counter() - t0
        env["PATH"] = f"{work / '.venv/bin'}:{env['PATH']}"
        with open(root / "dag.log", "w", buffering=1) as log:
            stages, dag, rc = timed_dag(work, env, log, args.side_by_side)
        # the headline make run prints after the DAG: each policy's held-out success, each agent's return
        headline = subprocess.run([str(work / ".venv/bin/dvc"), "metrics", "show"], cwd=work, env=env,
                                  capture_output=True, text=True).stdout
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    mode = ("side by side" if args.side_by_side else "one stage at a time") + \
        (", no warm start" if args.no_warm else ", warm start")
    isa = f"AVX2 caps ({AVX2_TEXT})" if args.avx2 else "the CPU's own ISA"
    print(f"commit {commit}  {mode}  {isa}  "
          f"cores {os.cpu_count()}  exit {rc}")
    for name, sec in sorted(stages.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<41} {sec:8.1f} s")
    print(f"  {'the DAG (make run)':<41} {dag:8.1f} s")
    if build is not None:
        print(f"  {'venv build':<41} {build:8.1f} s")
    total = dag + (build or 0.0)
    verdict = "within" if total <= args.budget_min * 60 else "OVER"
    print(headline.rstrip())
    print(f"total {total / 60:.1f} min ({'venv build excluded' if build is None else 'venv build included'}) "
          f"vs budget {args.budget_min:.0f} min: {verdict}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
