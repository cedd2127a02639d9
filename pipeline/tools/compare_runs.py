"""Two finished runs of the DAG, stage by stage: are their rows, models and metrics the same? (``curio compare
runs BEFORE AFTER``: two checkouts that ran the DAG, e.g. ``curio bench fresh-clone --keep DIR``)

For each stage of AFTER's dvc.lock: every out's content hash (md5 of a file, or of a directory's listing, as DVC
records it) against BEFORE's, and the stage's metrics file (``metrics/stages/NAME.json``) key by key, leaving out
wall-clock keys (``seconds`` and any key naming seconds, minutes or a rate per second), which differ between any
two runs. Exit code 1 when a data out or a metric differs.

Where both runs evaluated the text track, how far apart their held-out rows are: each policy's success rate in
BEFORE and AFTER and their paired difference over the same held-out tasks, AFTER − BEFORE, with its standard error
(``pipeline.reporting.breakdown``), to tell a change of rounding from one of behaviour.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from pyarrow import ArrowException

from pipeline.core.artifacts import read_rows
from pipeline.core.errors import CurioError
from pipeline.reporting.breakdown import held_out, paired_difference, task_means
from pipeline.tools import ToolError

TIMING = re.compile(r"(^|_|/)(seconds|secs|minutes|wall|per_s|per_sec|fps|elapsed)($|_|/)|_s$")


def checkout(path: Path) -> Path:
    """The directory holding dvc.lock (``curio bench fresh-clone --keep DIR`` clones into DIR/curio)."""
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
    print_held_out_shift(before, after)
    return not failed


def evaluation_rows(root: Path) -> list[dict]:
    """evaluate-text's held-out episodes (policy, group, task, success), or none where the run has none."""
    path = root / "data" / "evaluate_text"
    if not path.is_dir():
        return []
    columns = ["policy", "group", "task_id", "split", "success"]
    try:
        return held_out(read_rows(path, columns))
    except (CurioError, ArrowException, KeyError) as e:
        raise ToolError(f"{path}: not evaluate-text's episodes "
                        f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def held_out_shift(before_dir: Path, after_dir: Path) -> list[tuple[str, float, float, float, float, int]]:
    """Per policy both runs evaluated: (policy, BEFORE's success, AFTER's, paired AFTER − BEFORE, its SE, tasks)."""
    rows_b, rows_a = evaluation_rows(checkout(before_dir)), evaluation_rows(checkout(after_dir))
    means_b, means_a = task_means(rows_b), task_means(rows_a)

    def rate(rows: list[dict], policy: str) -> float:
        got = [float(bool(r["success"])) for r in rows if r["policy"] == policy]
        return sum(got) / len(got)

    out = []
    for policy in means_a:
        if policy in means_b:
            d, se, n = paired_difference(means_a[policy], means_b[policy])
            out.append((policy, rate(rows_b, policy), rate(rows_a, policy), d, se, n))
    return out


def print_held_out_shift(before_dir: Path, after_dir: Path) -> None:
    shift = held_out_shift(before_dir, after_dir)
    if shift:
        print("held-out success, AFTER − BEFORE paired over the same tasks:")
        for policy, b, a, d, se, n in shift:
            print(f"    {policy:<8} {b:.4f} -> {a:.4f}   {d:+.4f} ± {se:.4f} ({d / se:+.1f} s.e., {n} tasks)"
                  if se > 0 else f"    {policy:<8} {b:.4f} -> {a:.4f}   {d:+.4f} ({n} tasks)")
