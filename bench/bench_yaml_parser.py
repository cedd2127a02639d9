"""DVC reads dvc.yaml, dvc.lock and params.yaml with ruamel.yaml: with its C parser (``ruamel.yaml.clib``, a
dependency of Curio) against its pure-Python one (ruamel.yaml 0.19's default without the extension).

    cd A_FINISHED_CHECKOUT && python bench/bench_yaml_parser.py [--rounds 3]

Run in a checkout whose DAG has run (`make run`). Each round times, once with the C parser and once with the
pure-Python one, in that order or the other (rounds alternate, so both see the same machine):

- ``dvc status --json``: what ``make run``'s ``dvc repro`` and a user's ``dvc status`` spend deciding what is current;
- ``dvc repro`` with nothing to run (every stage current: DVC checks each and runs none);
- the Prefect ``pipeline`` flow's bookkeeping, one pass over the stages (each stage asked whether it is current and
  then recorded as run, :mod:`pipeline.core.dvcrepo`, in one process, as in the flow).

A side runs in its own process; the pure-Python one is that process with the extension hidden (``_ruamel_yaml``
unimportable), which is what ruamel.yaml does without it installed. It prints each measurement, the medians and the
ratios, and checks the two parsers read the three files the same.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HIDE = "import sys; sys.modules['_ruamel_yaml'] = None\n"  # ruamel.yaml then falls back to its pure-Python parser
DVC = "from dvc.cli import main\nsys.exit(main(sys.argv[1:]))\n"
# bench/bench_dvc_calls.py's in-process pass (its import puts the checkout on sys.path)
FLOW = f"""sys.path.insert(0, {str(REPO / "bench")!r})
from bench_dvc_calls import api
from pipeline.core.dag import dag_order
import dvc.repo
print(api(dag_order()))
"""
WHAT = {"dvc status": (DVC, ["status", "--json"]), "dvc repro (nothing to run)": (DVC, ["repro"]),
        "the flow's bookkeeping, one pass": (FLOW, [])}


def side(code: str, args: list[str], pure: bool) -> float:
    """Seconds of one run: the whole process for the DVC commands, the pass itself for the flow's bookkeeping."""
    head = ("import sys\n" + HIDE) if pure else "import sys\n"
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", head + code, *args], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode:
        sys.exit(f"{'pure' if pure else 'C'} side failed:\n{res.stderr[-2000:]}")
    if "Running stage" in res.stdout:
        sys.exit("dvc repro ran a stage: run the DAG first (`make run`)")
    return float(res.stdout.split()[-1]) if code is FLOW else wall


def same_reading() -> None:
    from ruamel.yaml import YAML
    from ruamel.yaml.main import CParser

    if CParser is None:
        sys.exit("ruamel.yaml's C parser is not installed here (pip install ruamel.yaml.clib)")
    for name in ("dvc.yaml", "dvc.lock", "params.yaml"):
        text = Path(name).read_text()
        assert YAML(typ="safe").load(text) == YAML(typ="safe", pure=True).load(text), name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    same_reading()
    before = Path("dvc.lock").read_bytes()
    times: dict[tuple[str, bool], list[float]] = {}
    for r in range(args.rounds):
        for what, (code, dvc_args) in WHAT.items():
            for pure in ((False, True) if r % 2 == 0 else (True, False)):
                times.setdefault((what, pure), []).append(side(code, dvc_args, pure))
                print(f"round {r + 1} {what}, {'pure-Python' if pure else 'C'} parser: "
                      f"{times[what, pure][-1]:.2f} s", flush=True)
    for what in WHAT:
        c, p = statistics.median(times[what, False]), statistics.median(times[what, True])
        print(f"median, {what}: C parser {c:.2f} s, pure-Python {p:.2f} s ({p / c:.2f}x)")
    if Path("dvc.lock").read_bytes() != before:
        print("note: dvc.lock differs from before (a stage's outputs changed while it ran?)")


if __name__ == "__main__":
    main()
