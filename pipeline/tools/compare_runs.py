"""Two finished runs of the DAG, stage by stage: are their rows, models and metrics the same? (``curio compare
runs BEFORE AFTER``: two checkouts that ran the DAG, e.g. ``bench/fresh_clone_run.py --keep``)

For each stage of AFTER's dvc.lock: every out's content hash (md5 of a file, or of a directory's listing, as DVC
records it) against BEFORE's, and the stage's metrics file (``metrics/stages/NAME.json``) key by key, leaving out
wall-clock keys (``seconds`` and any key naming seconds, minutes or a rate per second), which differ between any
two runs. Exit code 1 when a data out or a metric differs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from pipeline.tools import ToolError

TIMING = re.compile(r"(^|_|/)(seconds|secs|minutes|wall|per_s|per_sec|fps|elapsed)($|_|/)|_s$")


def checkout(path: Path) -> Path:
    """The directory holding dvc.lock (bench/fresh_clone_run.py --keep DIR clones into DIR/curio)."""
    for candidate in (path, path / "curio"):
        if (candidate / "dvc.lock").is_file():
            return candidate
    raise ToolError(f"no dvc.lock under {path}")


def outs(lock: dict, stage: str) -> dict[str, str]:
    return {o["path"]: o.get("md5", "?") for o in lock["stages"].get(stage, {}).get("outs", [])}


def metrics(root: Path, stage: str) -> dict:
    path = root / "metrics" / "stages" / f"{stage}.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def compare_runs(before_dir: Path, after_dir: Path) -> bool:
    """Print the comparison, stage by stage; True when every data out and metric is the same."""
    before, after = checkout(before_dir), checkout(after_dir)
    lock_b = yaml.safe_load((before / "dvc.lock").read_text())
    lock_a = yaml.safe_load((after / "dvc.lock").read_text())
    failed = False
    print(f"{'stage':<18} {'outs':<28} metrics")
    for stage in lock_a["stages"]:
        ob, oa = outs(lock_b, stage), outs(lock_a, stage)
        data = [p for p in oa if not p.startswith("metrics/")]
        differ = [p for p in data if ob.get(p) != oa[p]]
        mb, ma = metrics(before, stage), metrics(after, stage)
        keys = sorted(k for k in set(mb) | set(ma) if not TIMING.search(k))
        changed = [k for k in keys if mb.get(k) != ma.get(k)]
        failed |= bool(differ or changed) or stage not in lock_b["stages"]
        out_text = "missing in BEFORE" if stage not in lock_b["stages"] else (
            f"{len(data) - len(differ)}/{len(data)} the same")
        met_text = f"{len(keys) - len(changed)}/{len(keys)} the same"
        print(f"{stage:<18} {out_text:<28} {met_text}")
        for p in differ:
            print(f"    out {p}: {ob.get(p)} -> {oa[p]}")
        for k in changed:
            print(f"    metric {k}: {mb.get(k)!r} -> {ma.get(k)!r}")
    print("row-identical" if not failed else "DIFFERENT")
    return not failed
