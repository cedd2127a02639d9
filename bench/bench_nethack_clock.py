"""NetHack's pinned clock (pipeline/nethack/clock.c) against another revision's, side by side in one run.

    python bench/bench_nethack_clock.py [--against REV] [--repeats 5]

Builds the clock library of this checkout and of ``REV`` (default ``HEAD``; the working tree's clock.c against the
last commit's) into a temp dir, then, alternating between the two, starts a Python process with each in
``LD_PRELOAD``, pins the clock as every NetHack env does, and times what a NetHack-hosting process does besides
NetHack: libc's ``time()`` called from outside NetHack (through ctypes), and the forward pass of a NetHack agent's
encoder (pipeline/nethack/sf.py: two 3×3 convolutions over 8 crops, one torch thread, as evaluate-nethack and the
sample-factory workers run it), each before and after the clock is pinned. Prints the medians and the ratio
REV ÷ this checkout. What NetHack itself sees is tests/test_nethack_clock.py's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.nethack.clock import compile_library

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "pipeline/nethack/clock.c"

PROBE = r"""
import ctypes, json, time
import torch
from torch import nn

torch.set_num_threads(1)
libc = ctypes.CDLL(None)
libc.time.restype = ctypes.c_long
torch.manual_seed(0)
crops = torch.randn(8, 16, 9, 9)
encoder = nn.Sequential(nn.Conv2d(16, 32, 3), nn.ELU(), nn.Conv2d(32, 32, 3), nn.ELU())


def per_call(fn, n):
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def measure():
    with torch.no_grad():
        return {"time() us": per_call(lambda: libc.time(None), 20000),
                "encoder us": per_call(lambda: encoder(crops), 300)}


out = {"unpinned": measure()}
libc.curio_nethack_clock_set(ctypes.c_longlong(1_700_000_000))
out["pinned"] = measure()
print(json.dumps(out))
"""


def build(source: str, out: Path) -> Path:
    src = out.with_suffix(".c")
    src.write_text(source)
    return compile_library(src, out)


def probe(library: Path) -> dict:
    res = subprocess.run([sys.executable, "-c", PROBE], env={"LD_PRELOAD": str(library), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="HEAD", help="the git revision whose clock.c to compare with")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    theirs = subprocess.run(["git", "show", f"{args.against}:{SOURCE}"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout
    ours = (ROOT / SOURCE).read_text()
    if theirs == ours:
        print(f"{SOURCE} is the same at {args.against}: nothing to compare (use --against REV)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        libs = {args.against: build(theirs, Path(tmp) / "theirs.so"),
                "this checkout": build(ours, Path(tmp) / "ours.so")}
        runs: dict[str, list[dict]] = {name: [] for name in libs}
        for _ in range(args.repeats):
            for name, lib in libs.items():
                runs[name].append(probe(lib))
    print(f"medians of {args.repeats} processes each, alternating (1 torch thread)")
    for state in ("unpinned", "pinned"):
        for figure in ("time() us", "encoder us"):
            med = {name: statistics.median(r[state][figure] for r in rs) for name, rs in runs.items()}
            a, b = med[args.against], med["this checkout"]
            print(f"  {state:8s} {figure:11s}  {args.against}: {a:9.2f}   this checkout: {b:9.2f}   ratio {a / b:6.2f}")


if __name__ == "__main__":
    main()
