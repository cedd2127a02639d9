"""ONI's labeller on a stream of NetHack's messages: its CPU per label (labelling, refits, publishing the table) and
whether it keeps up, for this checkout and optionally another revision, side by side.

    python bench/bench_nethack_labeller.py [--before REF] [--steps 120000] [--rate 1500] [--hogs 2] [--cpu N]

The stream: the distinct messages of ``--steps`` env steps of random play on the preset's task (score, ONI's extended
actions), each at the env step it was first seen (NetHack repeats its messages: a worker spools a message once).
Each side (this checkout; ``--before REF``: that revision's code, from ``git archive``) runs in a process of its own
that imports only that side's code, with the settings ``presets/nethack-oni-seeds.yaml`` gives ONI classification
(the embedding annotator, batches of 32, the online model's schedule). Two measurements per side:

- **burst**: the whole stream spooled at once and the annotator stepped until its queue is empty, in the side's
  process: CPU seconds per label and their split into labelling, refits (``fit``) and publishing the table
  (``publish``), timed around the annotator's own methods; the model's start-up (loading the encoder) is left out.
- **stream**: the annotator process as the side's trainer starts it (``pipeline.nethack.sf``'s observer: its
  settings and its CPU priority), fed the stream at ``--rate`` env steps per second (an agent's pace) on one core
  beside ``--hogs`` busy processes (the agents that share a core with it: four agents on two cores is two per core),
  from the moment it has started (its first status; in training its start-up overlaps the trainer's own, at most
  180 s here). When the stream ends (training ends) its status gives the queue: the share of the messages met
  still unlabelled, the lag the rl-nethack table reports.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]


def fail(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr)
    sys.exit(2)


# -- the stream (this checkout's code) --------------------------------------------------------------------------
def message_stream(steps: int, extended: bool, task: str) -> list[tuple[int, str]]:
    """(env step of first sight, message) for each distinct message of ``steps`` seeded random steps."""
    import numpy as np

    from pipeline.nethack.env import decode_message, make_env, seed_env

    env = make_env(task, extended_actions=extended)
    rng = np.random.default_rng(0)
    first: dict[str, int] = {}
    t, game = 0, 0
    while t < steps:
        seed_env(env, game)
        game += 1
        env.reset()
        done = False
        while not done and t < steps:
            obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            t += 1
            m = decode_message(obs["message"])
            if m and m not in first:
                first[m] = t
            done = terminated or truncated
    env.close()
    return [(step, m) for m, step in first.items()]


# -- one side, in its own process (imports only its --root's code) ------------------------------------------------
def settings(reward: str) -> dict:
    """ONI's settings from the side's params schema, as rl-nethack passes them (stages.rl_nethack.sf_args)."""
    from pipeline.nethack.config import OniConfig

    oni = OniConfig().model_dump(mode="json")
    refresh = oni.pop("refresh_s")
    return {"oni_config": json.dumps(oni, sort_keys=True, separators=(",", ":")), "refresh_s": refresh,
            "reward": reward}


def burst(directory: Path, stream: list, reward: str) -> dict:
    import torch

    from pipeline.nethack import oni

    torch.set_num_threads(1)
    s = settings(reward)
    ann = oni.OnlineAnnotator(directory, {**json.loads(s["oni_config"]), "reward": reward, "seed": 0})
    ann.embedder.embed(["warm-up"])  # the encoder's loading is start-up, not labelling
    getattr(ann.backend, "embed", lambda texts: None)(["warm-up"])
    parts = {"label": 0.0, "fit": 0.0, "publish": 0.0}
    for part, method in (("label", "_label"), ("fit", "fit"), ("publish", "publish")):
        inner = getattr(ann, method)

        def timed(*args, _inner=inner, _part=part):
            start = time.process_time()
            try:
                return _inner(*args)
            finally:
                parts[_part] += time.process_time() - start

        setattr(ann, method, timed)
    (directory / oni.SEEN).mkdir(parents=True, exist_ok=True)
    (directory / oni.SEEN / "worker.jsonl").write_text("".join(json.dumps(m) + "\n" for _, m in stream))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    ann.poll()
    while ann.pending():
        ann.step()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    status = ann.status()
    return {"labels": status["labels"] + status.get("given_up", 0), "seen": status["seen"], "cpu_s": cpu,
            "wall_s": wall, "parts": parts, "batches": status["batches"]}


def streamed(directory: Path, stream: list, reward: str, rate: float) -> dict:
    """The annotator process as the side's trainer starts it, fed the stream in real time."""
    from types import SimpleNamespace

    from pipeline.llm import online_annotation
    from pipeline.nethack import oni, sf

    s = settings(reward)
    cfg = SimpleNamespace(train_dir=str(directory), experiment="oni_classification", oni_config=s["oni_config"],
                          intrinsic_reward=reward, seed=0, oni_refresh_s=s["refresh_s"])
    observer = sf._online_annotation(cfg)
    spool_dir = sf.oni_directory(cfg) / oni.SEEN
    spool_dir.mkdir(parents=True, exist_ok=True)
    observer.on_init(None)  # starts the annotator process
    # its start-up (imports, the encoder) overlaps the trainer's own in training: the stream starts once it is up
    status_file = sf.oni_directory(cfg) / oni.STATUS
    launched = time.monotonic()
    while not status_file.exists() and time.monotonic() - launched < 180:
        time.sleep(0.2)
    start = time.monotonic()
    startup = start - launched
    with open(spool_dir / "worker.jsonl", "a") as spool:
        i = 0
        while i < len(stream):
            now_step = (time.monotonic() - start) * rate
            batch = []
            while i < len(stream) and stream[i][0] <= now_step:
                batch.append(stream[i][1])
                i += 1
            if batch:  # a worker flushes what it met every refresh_s
                spool.write("".join(json.dumps(m) + "\n" for m in batch))
                spool.flush()
            time.sleep(s["refresh_s"])
    wall = time.monotonic() - start
    time.sleep(s["refresh_s"])  # the last status the annotator writes before training ends
    online_annotation.stop(observer.proc)
    path = sf.oni_directory(cfg) / oni.STATUS
    status = json.loads(path.read_text()) if path.exists() else {}  # none: it never finished starting
    return {"status": status, "wall_s": wall, "streamed": len(stream), "startup_s": startup}


def child(args: argparse.Namespace) -> None:
    stream = json.loads(Path(args.stream).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        if args.child == "burst":
            out = burst(Path(tmp), stream, args.reward)
        else:
            out = streamed(Path(tmp), stream, args.reward, args.rate)
    Path(args.out).write_text(json.dumps(out))


# -- the parent --------------------------------------------------------------------------------------------------
def run_side(root: Path, mode: str, stream_file: Path, args: argparse.Namespace, tmp: Path) -> dict:
    out = tmp / f"{root.name}-{mode}.json"
    env = {**os.environ, "PYTHONPATH": str(root), "CURIO_CACHE_DIR": str(tmp / f"cache-{root.name}-{mode}"),
           "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(HERE), "--child", mode, "--root", str(root), "--stream", str(stream_file),
               "--out", str(out), "--reward", args.reward, "--rate", str(args.rate)]
    log = tmp / f"{root.name}-{mode}.log"
    with open(log, "w") as f:
        code = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=root).returncode
    if code != 0:
        raise RuntimeError(f"bench: the {mode} run of {root} failed (exit {code}):\n{log.read_text()[-3000:]}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="", help="a git revision to measure beside this checkout")
    parser.add_argument("--steps", type=int, default=120_000, help="env steps of random play behind the stream")
    parser.add_argument("--rate", type=float, default=1_500.0, help="stream: env steps per second (an agent's pace)")
    parser.add_argument("--hogs", type=int, default=2, help="stream: busy processes on the annotator's core")
    parser.add_argument("--cpu", type=int, default=None, help="the core (default: the last allowed)")
    parser.add_argument("--reward", default="classification", choices=("retrieval", "classification", "ranking"))
    parser.add_argument("--modes", default="burst,stream", help="burst, stream or both")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--root", default="", help=argparse.SUPPRESS)
    parser.add_argument("--stream", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.path.insert(0, args.root)
        child(args)
        return
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - {"burst", "stream"}:
        fail(f"--modes {args.modes!r}: burst, stream or both")
    sys.path.insert(0, str(ROOT))
    from pipeline.nethack.clock import preload

    preload()
    cpu = args.cpu if args.cpu is not None else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})  # the sides' processes inherit the core
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sides = {"this checkout": ROOT}
        if args.before:
            before = tmp / "before"
            before.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before], capture_output=True)
            if archive.returncode != 0:
                fail(f"--before {args.before!r}: {archive.stderr.decode().strip().splitlines()[-1]}")
            subprocess.run(["tar", "-x", "-C", str(before)], input=archive.stdout, check=True)
            sides = {f"before ({args.before})": before, **sides}
        start = time.process_time()
        stream = message_stream(args.steps, extended=True, task="score")
        stream_file = tmp / "stream.json"
        stream_file.write_text(json.dumps(stream))
        print(f"stream: {len(stream):,} distinct messages in {args.steps:,} random env steps (score, extended "
              f"actions; {time.process_time() - start:.0f} CPU s to play); core {cpu}", flush=True)
        results: dict[str, dict] = {}
        if "burst" in modes:
            print("\nburst: the whole stream queued at once, stepped until empty (CPU s, this process alone)")
            print(f"{'side':<24} {'labels':>7} {'CPU s':>7} {'labelling':>10} {'refits':>7} {'publishing':>11} "
                  f"{'CPU ms/label':>13} {'labels/CPU s':>13}")
            for name, root in sides.items():
                r = run_side(root, "burst", stream_file, args, tmp)
                results[f"{name} burst"] = r
                p = r["parts"]
                print(f"{name:<24} {r['labels']:>7} {r['cpu_s']:>7.1f} {p['label']:>10.1f} {p['fit']:>7.1f} "
                      f"{p['publish']:>11.1f} {1000 * r['cpu_s'] / r['labels']:>13.1f} "
                      f"{r['labels'] / r['cpu_s']:>13.0f}", flush=True)
        if "stream" in modes:
            print(f"\nstream: {args.rate:,.0f} env steps/s for {args.steps / args.rate:.0f} s, beside {args.hogs} busy "
                  f"processes on core {cpu} (the annotator process as each side's trainer starts it)")
            print(f"{'side':<24} {'start-up s':>10} {'messages':>9} {'labels':>7} {'unlabelled':>11} {'labels/s':>9} "
                  f"{'CPU s':>7}")
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
            try:
                for name, root in sides.items():
                    r = run_side(root, "stream", stream_file, args, tmp)
                    results[f"{name} stream"] = r
                    st, n = r["status"], r["streamed"]
                    labelled = st.get("labels", 0) + st.get("given_up", 0)  # given up: final, worth 0
                    print(f"{name:<24} {r['startup_s']:>10.1f} {n:>9} {labelled:>7} {100 * (n - labelled) / n:>10.1f}% "
                          f"{st.get('labels_per_s', 0.0):>9.2f} {st.get('cpu_s', float('nan')):>7.1f}", flush=True)
            finally:
                for h in hogs:
                    h.kill()
                    h.wait()


if __name__ == "__main__":
    main()
