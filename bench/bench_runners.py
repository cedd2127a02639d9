"""eval-sweep wall time on the Dask runner with 2 worker processes vs the local runner with 1, side by side.

    python bench/bench_runners.py [--seeds 4] [--eval-tasks 8] [--k 4] [--repeats 2]

Builds a small built-in policy first (the bootstrap stage with few episodes, in a temporary directory), then runs
the same sweep (checkpoint ``base``, the eval split, ``--seeds`` cells of ``--eval-tasks`` held-out tasks × k
episodes) alternately on the local runner with ``eval_sweep.max_workers=1`` and on the Dask runner connected to a
standing cluster on 127.0.0.1 (``dask scheduler`` and 2 single-threaded ``dask worker`` processes: what
`runner.address` points at in a real deployment; its start-up is printed apart). The scheduler and each worker run
in a session of their own, as separate programs do: this kernel shares CPU fairly between sessions (autogroup),
so two workers inside the bench's own session would share one session's CPU. One torch thread per worker and in
the local run. Prints each wall
time, the local/dask ratio, whether both wrote the same rows, and the load average (the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WORK = Path(tempfile.mkdtemp(prefix="curio-bench-runners-"))
os.environ.setdefault("PREFECT_HOME", str(WORK / "prefect"))  # before prefect is imported: its own database
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} on {os.cpu_count()} cores"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=4, help="sweep cells (one seed each)")
    ap.add_argument("--eval-tasks", type=int, default=8)
    ap.add_argument("--k", type=int, default=4, help="episodes per task and cell")
    ap.add_argument("--repeats", type=int, default=2, help="alternations of local and dask")
    ap.add_argument("--bootstrap-episodes", type=int, default=400)
    args = ap.parse_args()

    import torch
    import yaml

    from pipeline.core.config import _set_dotted, parse_override
    from pipeline.core.stage import execute
    from pipeline.orchestration.flows import eval_sweep_flow
    from pipeline.params import load_params

    torch.set_num_threads(1)
    overrides = ["tracking.enabled=false", f"data_dir={WORK / 'data'}", f"games.max_eval_tasks={args.eval_tasks}",
                 f"bootstrap.episodes={args.bootstrap_episodes}", "bootstrap.epochs=2"]
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    for o in overrides:
        _set_dotted(raw, *parse_override(o))
    params_file = WORK / "params.yaml"
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    t0 = time.perf_counter()
    execute("bootstrap", load_params(params_file))
    print(f"bootstrap (the policy under test): {time.perf_counter() - t0:.1f} s", flush=True)

    def sweep(kind: str, address: str | None, n: int) -> tuple[float, list[dict]]:
        start = time.perf_counter()
        rows = eval_sweep_flow(params_file=str(params_file), checkpoints=["base"], seeds=list(range(args.seeds)),
                               trajectories_per_task=args.k, out_dir=str(WORK / f"sweep-{kind}-{n}"),
                               overrides={"runner.kind": kind, "runner.address": address, "eval_sweep.max_workers": 1})
        return time.perf_counter() - start, rows

    sweep("local", None, -2)  # Prefect's database and this process's first policy load, untimed
    print(f"before: {load()}", flush=True)
    # The cluster as separate programs, each in its own session: the kernel here shares CPU fairly between
    # sessions (autogroup), so 2 workers inside one session would get the CPU of one however many cores exist.
    t0 = time.perf_counter()
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    dask_bin = str(Path(sys.executable).with_name("dask"))
    logs = open(WORK / "dask.log", "w")  # noqa: SIM115 - closed with the processes below
    procs = [subprocess.Popen([dask_bin, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--dashboard-address", ":0"], env=env, stdout=logs, stderr=subprocess.STDOUT,
                              start_new_session=True)]
    try:
        procs += [subprocess.Popen([dask_bin, "worker", address, "--nworkers", "1", "--nthreads", "1", "--host",
                                    "127.0.0.1", "--dashboard-address", ":0"], env=env, stdout=logs,
                                   stderr=subprocess.STDOUT, start_new_session=True) for _ in range(2)]
        from distributed import Client

        with Client(address, timeout=120) as client:
            client.wait_for_workers(2, timeout=300)
        print(f"dask cluster start (scheduler + 2 workers): {time.perf_counter() - t0:.1f} s", flush=True)
        sweep("dask", address, -1)  # the workers' first imports and policy load, untimed
        times: dict[str, list[float]] = {"local": [], "dask": []}
        results: dict[str, list] = {"local": [], "dask": []}
        for n in range(args.repeats):
            for kind, where in (("local", None), ("dask", address)):
                seconds, rows = sweep(kind, where, n)
                times[kind].append(seconds)
                results[kind].append(rows)
                print(f"round {n}: {kind:5s} {seconds:6.1f} s  ({load()})", flush=True)
    finally:
        for proc in reversed(procs):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        logs.close()
    same = all(r == results["local"][0] for rs in results.values() for r in rs)
    local, dask = statistics.median(times["local"]), statistics.median(times["dask"])
    episodes = args.seeds * args.eval_tasks * args.k
    print(f"\neval-sweep: {args.seeds} cells × {args.eval_tasks} tasks × k={args.k} = {episodes} episodes of the "
          f"built-in policy per run")
    print(f"local runner, 1 worker : median {local:6.1f} s  {times['local']}")
    print(f"dask runner, 2 workers : median {dask:6.1f} s  {times['dask']}")
    print(f"ratio local/dask: {local / dask:.2f}x   rows identical: {same}   after: {load()}")


if __name__ == "__main__":
    main()
