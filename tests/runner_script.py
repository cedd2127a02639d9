"""The cluster half of tests/test_runners.py, in one process (one Prefect API for every run in it).

    python tests/runner_script.py PARAMS_FILE OUT_DIR

Starts a Dask scheduler with 2 single-threaded worker processes on 127.0.0.1, runs rollout-text, annotate-text
and evaluate-text on it (data in OUT/dask), a chunk job whose worker dies mid-chunk (OUT/lost), the eval-sweep on
the local runner and on Dask (OUT/sweep-*), rollout-text on a local Ray head (OUT/ray), and eval-sweeps whose
cells only count how many run at once (eval_sweep.max_workers 1 and 3); writes OUT/summary.json.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path


def square(_state, index: int, marks: str) -> list[dict]:
    """A chunk whose worker process dies the first time chunk 2 is computed."""
    runs = Path(marks) / f"chunk-{index}"
    with open(runs, "a") as f:
        f.write("x")
    if index == 2 and runs.read_text() == "x":
        os._exit(1)
    return [{"chunk": index, "square": index * index}]


def peak_cells(params_file: str, out: Path, workers: int) -> int:
    """How many eval-sweep cells ran at once on the local runner with ``eval_sweep.max_workers = workers``."""
    import stages.evaluate_text
    from pipeline.orchestration.flows import eval_sweep_flow

    state = {"running": 0, "peak": 0}
    lock = threading.Lock()

    def counting(params, policy, split, seed, k, temperature, groups=None):
        with lock:
            state["running"] += 1
            state["peak"] = max(state["peak"], state["running"])
        time.sleep(1.0)
        with lock:
            state["running"] -= 1
        return [{"group": g, "success": True, "turns": 3, "score": 1.0, "invalid": 0.0} for g in groups]

    real, stages.evaluate_text.evaluate_policy = stages.evaluate_text.evaluate_policy, counting
    try:
        eval_sweep_flow(params_file=params_file, checkpoints=["base"], seeds=[0, 1, 2, 3], out_dir=str(out),
                        overrides={"eval_sweep.max_workers": workers})
    finally:
        stages.evaluate_text.evaluate_policy = real
    return state["peak"]


def main(params_file: str, out: Path) -> None:
    import cloudpickle
    from distributed import Client, LocalCluster

    from pipeline.core.artifacts import read_rows
    from pipeline.core.config import RunnerConfig
    from pipeline.core.runners import ChunkJob, run_chunked, use_runner
    from pipeline.core.stage import execute
    from pipeline.orchestration.flows import eval_sweep_flow
    from pipeline.params import load_params

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import this file
    summary: dict = {"seconds": {}}
    start = time.perf_counter()

    def lap(name: str) -> None:
        summary["seconds"][name] = round(time.perf_counter() - start - sum(summary["seconds"].values()), 1)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        dask = {"runner.kind": "dask", "runner.address": cluster.scheduler_address, "data_dir": str(out / "dask")}
        params = load_params(params_file, dask)
        lap("dask cluster")
        execute("rollout-text", params)
        # each worker that played chunks holds the one policy it loaded, for its next chunks
        loaded = client.run(lambda: len(__import__("pipeline.core.runners").core.runners._LOADED))
        summary["cached_per_worker"] = list(loaded.values())
        for stage in ("annotate-text", "evaluate-text"):
            execute(stage, params)
        lap("dask stages")

        marks = out / "marks"
        marks.mkdir()
        with use_runner(RunnerConfig(kind="dask", address=cluster.scheduler_address)):
            run_chunked(out / "lost", num_chunks=4, make_chunk=ChunkJob(run=square, inputs=[str(marks)] * 4),
                        params_hash="p")
        summary["lost_rows"] = read_rows(out / "lost")
        summary["lost_runs"] = {p.name: len(p.read_text()) for p in marks.iterdir()}
        lap("lost worker")

        for kind in ("local", "dask"):
            summary[f"sweep_{kind}"] = eval_sweep_flow(
                params_file=params_file, checkpoints=["base"], seeds=[0, 1], out_dir=str(out / f"sweep-{kind}"),
                overrides={**dask, "runner.kind": kind, "eval_sweep.max_workers": 1})
        lap("eval-sweeps")

    execute("rollout-text", load_params(params_file, {"runner.kind": "ray", "runner.workers": 2,
                                                      "data_dir": str(out / "ray")}))
    lap("ray")
    summary["peak_cells"] = {w: peak_cells(params_file, out / f"peak-{w}", w) for w in (1, 3)}
    lap("max_workers")
    print(json.dumps(summary["seconds"]))
    (out / "summary.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
