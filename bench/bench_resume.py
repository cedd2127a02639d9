"""Time of a rollout-text rerun after a SIGKILL at ~90% vs a full uninterrupted run, side by side.

    python bench/bench_resume.py

Copies the project to a temp dir (reusing data/bootstrap, which must exist), runs rollout-text once in full,
then again from scratch killed when 90% of its parts are written, then the resume; prints the ratio.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline.core.artifacts import read_manifest, read_rows

REPO = Path(__file__).resolve().parents[1]


def stage(cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pipeline.cli", "stage", "rollout-text", "-S", "tracking.enabled=false"],
                   cwd=cwd, check=True, capture_output=True, env={**os.environ, "TQDM_DISABLE": "1"})
    return time.perf_counter() - t0


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    for name in ("params.yaml",):
        shutil.copy(REPO / name, tmp / name)
    (tmp / "data").mkdir()
    shutil.copytree(REPO / "data" / "bootstrap", tmp / "data" / "bootstrap")
    full = stage(tmp)
    reference = read_rows(tmp / "data" / "rollout_text")
    total = read_manifest(tmp / "data" / "rollout_text")["num_parts"]
    shutil.rmtree(tmp / "data" / "rollout_text")

    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "stage", "rollout-text", "-S",
                             "tracking.enabled=false"], cwd=tmp, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "TQDM_DISABLE": "1"})
    target = int(0.9 * total)
    while True:
        m = read_manifest(tmp / "data" / "rollout_text")
        if m and len(m["parts"]) >= target:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            break
        time.sleep(0.02)
    done = len(read_manifest(tmp / "data" / "rollout_text")["parts"])
    rerun = stage(tmp)
    same = read_rows(tmp / "data" / "rollout_text") == reference
    print(f"parts: {total}; killed with {done} finished ({done / total:.0%})")
    print(f"full run: {full:.1f} s   rerun after kill: {rerun:.1f} s   ratio rerun/full: {rerun / full:.2f}")
    print(f"rows identical to the uninterrupted run: {same}")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
