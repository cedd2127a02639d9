"""The tables of a seed sweep from its DVC experiments (``curio table --seeds``, and ``curio sweep`` at its end).

Each seed's experiment is read at its commit through DVC's file system (``dvc.api.DVCFileSystem``): every stage's
metrics file (git-tracked in the experiment's commit) and evaluate-text's held-out rows (in DVC's cache). The tables
are pipeline/reporting/seeds.py's; they are printed and written to ``data/seeds/NAME/seeds.md`` and ``seeds.json``
(NAME: the sweep's, ``default`` without presets), where the report finds them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from pipeline.core.artifacts import atomic_write_bytes, atomic_write_json
from pipeline.reporting.breakdown import held_out
from pipeline.reporting.seeds import SeedRun, seed_summary, seed_tables
from pipeline.tools import ToolError

ROW_COLUMNS = ["policy", "group", "task_id", "split", "success"]
FINISHED = "success"  # an experiment's state once it has run to the end


def dvc_bin() -> str:
    """This environment's dvc (beside its interpreter, where a venv's is not on PATH)."""
    here = Path(sys.executable).parent / "dvc"
    return str(here) if here.exists() else "dvc"


def dvc(*args: str, check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``dvc ARGS`` of this environment, in ``cwd`` (default: here)."""
    res = subprocess.run([dvc_bin(), *args], cwd=cwd, capture_output=True, text=True)
    if check and res.returncode != 0:
        message = (res.stderr.strip() or res.stdout.strip() or "failed").splitlines()
        raise ToolError(f"dvc {' '.join(args[:3])}: {message[0] if message else 'failed'}")
    return res


def exp_show(tries: int = 5, wait_s: float = 3.0) -> str:
    """``dvc exp show --json``, tried again where it fails while the queue's worker sets up or cleans a seed's copy
    (it reads the copies under .dvc/tmp/exps, one of which may be half made)."""
    for attempt in range(tries):
        res = dvc("exp", "show", "--json", check=attempt == tries - 1)
        if res.returncode == 0:
            return res.stdout
        time.sleep(wait_s)
    raise AssertionError("unreachable")


def experiments() -> dict[str, dict[str, Any]]:
    """The experiments of the checkout's commit (``dvc exp show --json``), by name: state (queued, running,
    success, failed), the experiment's commit and its queue task."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    found: dict[str, dict[str, Any]] = {}
    for baseline in json.loads(exp_show()):
        if baseline.get("rev") != head:
            continue
        for exp in baseline.get("experiments") or []:
            rev = (exp.get("revs") or [{}])[0]
            executor = exp.get("executor") or {}
            name = exp.get("name") or rev.get("name")
            if name:  # a committed experiment without a task is a finished one
                found[name] = {"state": executor.get("state") or FINISHED, "rev": rev.get("rev"),
                               "task": (executor.get("local") or {}).get("task_id")}
    return found


def read_seed_run(name: str, rev: str) -> SeedRun:
    """One experiment's stage metrics and held-out rows, read at its commit."""
    from dvc.api import DVCFileSystem

    fs = DVCFileSystem(".", rev=rev)
    params = yaml.safe_load(fs.read_text("params.yaml")) or {}
    data = str(params.get("data_dir") or "data").rstrip("/")
    metrics = str(params.get("metrics_dir") or f"{Path(data).parent / 'metrics'}").removeprefix("./")
    stages = {}
    for path in fs.glob(f"{metrics}/stages/*.json"):
        stages[Path(path).stem] = json.loads(fs.read_text(path))
    rows: list[dict] = []
    for part in sorted(fs.glob(f"{data}/evaluate_text/part-*.parquet")):
        with fs.open(part, "rb") as f:
            rows += pq.read_table(f, columns=ROW_COLUMNS).to_pylist()
    seed = int(params.get("seed", 0))
    return SeedRun(name=name, seed=seed, stages=stages, rows=held_out(rows))


def seed_runs(prefix: str, names: list[str] | None = None) -> list[SeedRun]:
    """The finished experiments of the checkout's commit named ``PREFIXseed-K`` (or exactly ``names``), by seed."""
    found = experiments()
    pattern = re.compile(re.escape(prefix) + r"seed-(\d+)")
    wanted = names or sorted((n for n in found if pattern.fullmatch(n)), key=lambda n: int(n.rsplit("-", 1)[1]))
    finished = [n for n in wanted if found.get(n, {}).get("state") == FINISHED]
    if not finished:
        raise ToolError(f"no finished experiment named {prefix}seed-K on this commit (`dvc exp show`; run "
                        f"`curio sweep seeds N` first)")
    return [read_seed_run(n, found[n]["rev"]) for n in finished]


def write_seed_tables(prefix: str, names: list[str] | None = None, markdown: bool = False,
                      data: Path = Path("data")) -> list[str]:
    """The sweep's tables as lines; ``data/seeds/NAME/seeds.md`` (markdown) and ``seeds.json`` written."""
    runs = seed_runs(prefix, names)
    out = data / "seeds" / (prefix.rstrip("-") or "default")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "seeds.md", ("\n".join(seed_tables(runs, markdown=True)) + "\n").encode())
    atomic_write_json(out / "seeds.json", seed_summary(runs))
    return [*seed_tables(runs, markdown=markdown), "",
            f"written: {out / 'seeds.md'}, {out / 'seeds.json'} (`curio report` adds them to its page)"]
