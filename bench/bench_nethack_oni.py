"""APPO frames per second with ONI's online annotation vs extrinsic-only, measured side by side in one run.

    python bench/bench_nethack_oni.py [--steps 120000] [--repeats 2] [--reward classification] [--latency 1.0]

Sides (each a fresh sample-factory experiment with the rl-nethack stage's default settings, run one after the
other and alternating, so load from other processes hits all alike):

- ``extrinsic``: int_coef = 0, no annotator.
- ``oni-embedding``: the online reward (``--reward``, default classification: labels + online model training),
  labelled by the default embedding annotator (no LLM) in its own process.
- ``oni-server``: the same, labelled through the ``openai`` backend by the loopback fake server
  (tests/fake_openai_server.py) answering every request after ``--latency`` seconds.

Each online run gets an empty LLM cache, so every label is really asked. Printed per run: FPS and, at the end
of the run, the annotator's queue (messages seen but not yet labelled = the annotation lag), labels and label
rate. Goal: median FPS online / extrinsic ≥ 0.85 for both annotators.

Online annotation costs most at the start of a run (the annotator process imports and loads its model, and most
messages are new); the 2 cores take that from the rollout workers, so short runs understate the steady ratio
(idle machine, embedding annotator: 0.56 at 20,000 env steps, 0.96 at 120,000).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.llm.config import LLMConfig
from pipeline.nethack import oni
from pipeline.nethack.config import RLNetHackVariant
from pipeline.nethack.sf import SUMMARY
from pipeline.params import Params, load_params
from stages.rl_nethack import sf_args

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from fake_openai_server import CURIO_RULES, FakeServer  # noqa: E402


def run_once(params: Params, name: str, variant: RLNetHackVariant, train_dir: Path, steps: int) -> dict:
    args = sf_args(params, name, variant, train_dir, train_dir / "no_reward_model")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "CURIO_CACHE_DIR": str(train_dir / name / "llm-cache")}
    log = train_dir / f"{name}.log"
    with open(log, "w") as out:
        code = subprocess.run([sys.executable, "-m", "pipeline.nethack", *args, f"--train_for_env_steps={steps}"],
                              stdout=out, stderr=subprocess.STDOUT, env=env, timeout=1200).returncode
    if code != 0:
        raise SystemExit(f"training failed, see {log}")
    summary = json.loads((train_dir / name / SUMMARY).read_text())
    status_file = train_dir / name / "oni" / oni.STATUS
    summary["oni"] = json.loads(status_file.read_text()) if status_file.exists() else {}
    return summary


def main() -> None:
    from pipeline.nethack.clock import preload

    preload()  # NetHack's clock pinned (nethack.clock) here and in the processes started below
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120_000,
                        help="env steps per run (the annotator's start-up is a fixed cost: short runs understate FPS)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per side")
    parser.add_argument("--reward", default="classification", choices=oni.ONLINE_REWARDS)
    parser.add_argument("--latency", type=float, default=1.0, help="fake server: seconds per request")
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    args = parser.parse_args()

    base = load_params(args.params) if Path(args.params).exists() else Params()
    server = FakeServer()
    server.configure(latency_s=args.latency, rules=CURIO_RULES)  # answers Curio's label prompt
    fake = LLMConfig(backend="openai", model="fake", base_url=server.base_url, temperature=0.1, top_p=0.95,
                     max_tokens=256, max_concurrency=16)
    served = base.model_copy(update={"rl_nethack": base.rl_nethack.model_copy(update={
        "oni": base.rl_nethack.oni.model_copy(update={"annotator": fake})})})
    sides = {
        "extrinsic": (base, RLNetHackVariant(ext_coef=0.1, int_coef=0.0, reward="none")),
        "oni-embedding": (base, RLNetHackVariant(ext_coef=0.1, int_coef=0.4, reward=args.reward)),
        "oni-server": (served, RLNetHackVariant(ext_coef=0.1, int_coef=0.4, reward=args.reward)),
    }
    fps: dict[str, list[float]] = {side: [] for side in sides}
    print(f"reward {args.reward}; fake server latency {args.latency} s; {args.steps} env steps per run")
    print(f"{'run':>4} {'side':>14} {'env steps':>10} {'FPS':>7} {'seen':>6} {'labels':>7} {'queue':>6} "
          f"{'labels/s':>9} {'LLM sent':>9}")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.repeats):
                for side, (p, variant) in sides.items():
                    s = run_once(p, f"{side}-{r}", variant, Path(tmp), args.steps)
                    fps[side].append(s["fps"])
                    o = s["oni"]
                    print(f"{r:>4} {side:>14} {s['env_steps_this_run']:>10} {s['fps']:>7.0f} {o.get('seen', '-'):>6} "
                          f"{o.get('labels', '-'):>7} {o.get('pending', '-'):>6} {o.get('labels_per_s', '-'):>9} "
                          f"{o.get('llm_sent', '-'):>9}", flush=True)
    finally:
        server.close()
    ext = statistics.median(fps["extrinsic"])
    for side in ("oni-embedding", "oni-server"):
        mine = statistics.median(fps[side])
        print(f"APPO FPS {side} / extrinsic = {mine:.0f} / {ext:.0f} = {mine / ext:.3f} (goal >= 0.85)")


if __name__ == "__main__":
    main()
