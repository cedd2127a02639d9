"""The default DAG as a new user runs it (``curio bench fresh-clone``): a fresh clone, the venv build, `make run`;
per-stage seconds, the headline `make run` prints, and the total against a budget.

Clones this checkout (``git clone`` of ``--ref``, committed work only) into a temp dir, builds the venv with the
Makefile's own recipe (or symlinks ``--venv`` to skip the build and time the DAG alone, with the clone's own NetHack
clock library built beside it), runs the default DAG (``python -m pipeline.orchestration.run_dvc``, what ``make run``
runs) and prints each stage's seconds (a stage `dvc repro` runs: from the moment dvc starts it to the next stage's
start; a stage run beside it: its own wall time), the venv build, the headline (``dvc metrics show``), the total and the
budget. ``--results FILE`` also writes them as markdown tables, the form docs/results/current/ keeps a headline in.

``--avx2`` caps the instruction set of torch's three kernel libraries at AVX2, as on an AVX2-only machine:
``ATEN_CPU_CAPABILITY=avx2`` (torch's own kernels), ``ONEDNN_MAX_CPU_ISA=AVX2`` (oneDNN: ``policy.cpu_linear:
onednn``, convolutions) and ``MKL_ENABLE_INSTRUCTIONS=AVX2`` (MKL's GEMM, torch's matmul). The clock, caches and
memory stay this machine's. ``--no-warm``: every stage command loads its own libraries (``CURIO_WARM=0``, no warm
start: pipeline/stage_server.py).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.nethack.clock import LIBRARY_ENV, compile_library
from pipeline.tools import REPO

# What --avx2 sets: every kernel library torch dispatches to, capped at AVX2.
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
AVX2_TEXT = " ".join(f"{k}={v}" for k, v in AVX2_ENV.items())
STAGE_LINE = re.compile(r"^Running stage '([^']+)':")  # dvc repro's own (the stages of its branch, in order)
# pipeline.orchestration.run_dvc's line for a stage it ran beside dvc repro
SIDE_DONE = re.compile(r"Stage '([^']+)' finished in ([0-9.]+) s \(beside dvc repro\)")
MAIN_DONE = re.compile(r"^dvc repro .*: done in")
WAIT = "(waiting for branches beside, dvc commit)"
BESIDE = " (beside)"


@dataclass
class Options:
    ref: str = "HEAD"
    avx2: bool = False
    venv: Path | None = None
    keep: Path | None = None
    budget_min: float = 12.0
    side_by_side: bool = False
    no_warm: bool = False


@dataclass
class Run:
    """What one fresh-clone run measured."""

    commit: str = ""
    stages: dict[str, float] = field(default_factory=dict)
    dag_s: float = 0.0
    build_s: float | None = None
    exit_code: int = 0
    summaries: dict[str, dict[str, float]] = field(default_factory=dict)  # metrics/TRACK_SECTION.json
    headline: str = ""  # what `dvc metrics show` printed
    table: str = ""  # what `curio table` printed: held-out success ± s.e., pass@4, paired differences


def timed_dag(cwd: Path, env: dict[str, str], log, side_by_side: bool = False) -> tuple[dict[str, float], float, int]:
    """Run the DAG, streaming its output to ``log``; per-stage seconds, the total, and the exit code.

    A stage ``dvc repro`` runs counts from its "Running stage" line to the next one (or to the end of that
    ``dvc repro``); a stage run beside it (``pipeline.orchestration.run_dvc``) counts its own wall time, and is marked
    so.
    """
    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    current, started = None, t0
    cmd = [str(cwd / ".venv/bin/python"), "-m", "pipeline.orchestration.run_dvc",
           *(["--side-by-side"] if side_by_side else [])]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        # a line printed beside dvc repro's may follow a progress bar's last redraw on the same line
        m, side, done = STAGE_LINE.match(line), SIDE_DONE.search(line), MAIN_DONE.match(line)
        if side:
            stages[f"{side.group(1)}{BESIDE}"] = float(side.group(2))
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


def environment(options: Options) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONUNBUFFERED"] = "1"  # dvc's "Running stage" lines must arrive when printed: they time the stages
    if options.avx2:
        env.update(AVX2_ENV)
    if options.no_warm:
        env["CURIO_WARM"] = "0"
    return env


def prepare(work: Path, options: Options, env: dict[str, str]) -> tuple[str, float | None]:
    """Clone ``options.ref`` into ``work`` and give it a venv; its short commit and the venv build's seconds."""
    subprocess.run(["git", "clone", "-q", str(REPO), str(work)], check=True)
    subprocess.run(["git", "checkout", "-q", options.ref], cwd=work, check=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=work, check=True,
                            capture_output=True, text=True).stdout.strip()
    t0 = time.perf_counter()
    if options.venv:
        (work / ".venv").symlink_to(options.venv.resolve())
        # a shared venv's editable install points elsewhere: make the clone's code win, and its NetHack clock
        # library (the shared venv's is built from another checkout's clock.c): built as `make nethack-clock`
        # builds it, into the clone
        env["PYTHONPATH"] = str(work)
        (work / ".cache").mkdir(exist_ok=True)
        env[LIBRARY_ENV] = str(compile_library(work / "pipeline/nethack/clock.c",
                                               work / ".cache" / "curio_nethack_clock.so"))
        return commit, None
    subprocess.run(["make", "install"], cwd=work, env=env, check=True)
    return commit, time.perf_counter() - t0


def fresh_clone_run(options: Options) -> Run:
    """Clone, build, run the default DAG and read its headline; the clone is removed unless ``options.keep``."""
    root = options.keep.resolve() if options.keep else Path(tempfile.mkdtemp(prefix="curio-bench-run-"))
    work, env, run = root / "curio", environment(options), Run()
    try:
        run.commit, run.build_s = prepare(work, options, env)
        env["PATH"] = f"{work / '.venv/bin'}:{env['PATH']}"
        with open(root / "dag.log", "w", buffering=1) as log:
            run.stages, run.dag_s, run.exit_code = timed_dag(work, env, log, options.side_by_side)
        # the headline make run prints after the DAG: each policy's held-out success, each agent's return
        run.headline = subprocess.run([str(work / ".venv/bin/dvc"), "metrics", "show"], cwd=work, env=env,
                                      capture_output=True, text=True).stdout
        run.summaries = {f.stem: json.loads(f.read_text()) for f in sorted((work / "metrics").glob("*.json"))}
        run.table = subprocess.run([str(work / ".venv/bin/curio"), "table"], cwd=work, env=env,
                                   capture_output=True, text=True).stdout
    finally:
        if not options.keep:
            shutil.rmtree(root, ignore_errors=True)
    return run


def describe(options: Options) -> str:
    mode = ("side by side" if options.side_by_side else "one stage at a time") + \
        (", no warm start" if options.no_warm else ", warm start")
    isa = f"AVX2 caps ({AVX2_TEXT})" if options.avx2 else "the CPU's own ISA"
    return f"{mode}, {isa}"


def printed(run: Run, options: Options) -> list[str]:
    """The lines ``curio bench fresh-clone`` prints."""
    lines = [f"commit {run.commit}  {describe(options)}  cores {os.cpu_count()}  exit {run.exit_code}"]
    lines += [f"  {name:<41} {sec:8.1f} s" for name, sec in sorted(run.stages.items(), key=lambda kv: -kv[1])]
    lines.append(f"  {'the DAG (make run)':<41} {run.dag_s:8.1f} s")
    if run.build_s is not None:
        lines.append(f"  {'venv build':<41} {run.build_s:8.1f} s")
    total = run.dag_s + (run.build_s or 0.0)
    verdict = "within" if total <= options.budget_min * 60 else "OVER"
    lines.append(run.headline.rstrip())
    build = "venv build excluded" if run.build_s is None else "venv build included"
    lines.append(f"total {total / 60:.1f} min ({build}) vs budget {options.budget_min:.0f} min: {verdict}")
    return lines


def results_markdown(run: Run, options: Options, command: str) -> str:
    """The run as docs/results/current/ keeps a headline: the command, the machine, the headline, the timings."""
    from pipeline.reporting.report import in_pipeline_order

    total = run.dag_s + (run.build_s or 0.0)
    lines = ["# The default run from a fresh clone", "",
             f"Written by `{command}`: a fresh clone of commit `{run.commit}`, {describe(options)}, "
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores. Exit code {run.exit_code}.", "",
             "## Headline", "", "What `make run` prints at its end (`dvc metrics show`), in pipeline order.", ""]
    for name, tracks in run.summaries.items():
        for track, values in tracks.items():
            lines += [f"| {track} ({name.removeprefix(f'{track}_')}) | value |", "|---|---|"]
            lines += [f"| {policy} | {values[policy]} |" for policy in in_pipeline_order(list(values))] + [""]
    if run.table.strip():
        lines += ["## Held-out table", "", "What `curio table` prints in the finished run.", "", "```",
                  run.table.rstrip(), "```", ""]
    lines += ["## Timing", "", "Seconds from DVC starting a stage to the next stage's start, longest first.", "",
              "| stage | seconds |", "|---|---|"]
    lines += [f"| {name} | {sec:.1f} |" for name, sec in sorted(run.stages.items(), key=lambda kv: -kv[1])]
    lines += [f"| the DAG (`make run`) | {run.dag_s:.1f} |"]
    lines += [f"| venv build (`make install`) | {run.build_s:.1f} |"] if run.build_s is not None else []
    lines += [f"| in all | {total:.1f} ({total / 60:.1f} min) |", ""]
    return "\n".join(lines)
