"""Chunked stages and the eval-sweep on Prefect's Dask and Ray task runners, against the local runner.

A real Dask scheduler with 2 worker processes (started and stopped here, on 127.0.0.1) and a real Ray head
(started by the runner inside the command, stopped when it ends). Play uses the games' scripted player, so a
run takes seconds; the commands run in subprocesses sharing one PREFECT_HOME (Prefect's database is set up once).
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from pipeline.artifacts import read_rows
from pipeline.config import _set_dotted, load_params, parse_override
from pipeline.stage import execute

SCRIPTED = [
    "tracking.enabled=false", "policy.backend=scripted", "policy.model=scripted:0.4",
    "games.groups=[wordle,mastermind]", "games.max_train_tasks=5", "games.max_eval_tasks=3",
    "rollout_text.trajectories_per_task=2", "rollout_text.tasks_per_chunk=2", "evaluate_text.trajectories_per_task=2",
    "evaluate_text.policies=[base]",
]


@pytest.fixture(scope="module")
def prefect_env(tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("prefect")
    return {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1"}


@pytest.fixture(scope="module")
def dask_address():
    """A Dask scheduler and 2 single-threaded worker processes on 127.0.0.1, for the module's tests."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster:
        yield cluster.scheduler_address


def write_params(path: Path, overrides: list[str]) -> Path:
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    for o in overrides:
        _set_dotted(raw, *parse_override(o))
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def curio(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, f"curio {' '.join(args)}:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    return res


def local_reference(tmp_path: Path, stages: list[str]) -> Path:
    params = load_params(REPO / "params.yaml", [*SCRIPTED, f"data_dir={tmp_path / 'local'}"])
    for stage in stages:
        execute(stage, params)
    return tmp_path / "local"


def test_runner_section_validates_and_local_is_the_default():
    assert load_params(REPO / "params.yaml").runner.kind == "local"
    with pytest.raises(ValueError, match="runner.kind"):
        load_params(REPO / "params.yaml", ["runner.kind=slurm"])


def test_chunked_stages_on_dask_write_the_local_rows_and_load_once_per_worker(tmp_path, prefect_env, dask_address):
    from distributed import Client

    stages = ["rollout-text", "annotate-text", "evaluate-text"]
    local = local_reference(tmp_path, stages)
    params_file = write_params(tmp_path / "params.yaml", [*SCRIPTED, f"data_dir={tmp_path / 'dask'}",
                                                          "runner.kind=dask", f"runner.address={dask_address}"])
    curio(["stage", "rollout-text", "-p", str(params_file)], tmp_path, prefect_env)
    with Client(dask_address) as client:
        # Each worker that played chunks still holds the policy it loaded (one entry): chunks reuse it.
        cached = client.run(lambda: __import__("pipeline.runners").runners._LOADED.copy().__len__())
    assert sum(cached.values()) >= 1 and set(cached.values()) <= {0, 1}
    for stage in stages[1:]:
        curio(["stage", stage, "-p", str(params_file)], tmp_path, prefect_env)
    for out in ("rollout_text", "annotate_text", "evaluate_text"):
        assert read_rows(tmp_path / "dask" / out) == read_rows(local / out), out
    manifest = json.loads((tmp_path / "dask" / "rollout_text" / "_manifest.json").read_text())
    assert manifest["complete"] and manifest["num_parts"] == 5  # 10 tasks, 2 per chunk: one part per chunk


def test_rollout_on_a_local_ray_head_writes_the_local_rows(tmp_path, prefect_env):
    local = local_reference(tmp_path, ["rollout-text"])
    params_file = write_params(tmp_path / "params.yaml", [*SCRIPTED, f"data_dir={tmp_path / 'ray'}",
                                                          "runner.kind=ray", "runner.workers=2"])
    curio(["stage", "rollout-text", "-p", str(params_file)], tmp_path, prefect_env)
    assert read_rows(tmp_path / "ray" / "rollout_text") == read_rows(local / "rollout_text")


# A chunk job whose worker process dies in the middle of chunk 2 the first time it is computed.
LOST_WORKER = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path

    from pipeline.artifacts import read_rows, run_chunked
    from pipeline.config import RunnerConfig
    from pipeline.runners import ChunkJob, use_runner

    def square(_state, index, marks):
        runs = Path(marks) / f"chunk-{index}"
        with open(runs, "a") as f:
            f.write("x")
        if index == 2 and runs.read_text() == "x":
            os._exit(1)  # the worker is lost mid-chunk
        return [{"chunk": index, "square": index * index}]

    out, marks, address = sys.argv[1:]
    with use_runner(RunnerConfig(kind="dask", address=address)):
        run_chunked(out, num_chunks=4, make_chunk=ChunkJob(run=square, inputs=[marks] * 4), params_hash="p")
    print(json.dumps(read_rows(out)))
""")


def test_a_worker_lost_mid_chunk_costs_that_chunk_and_the_rows_are_whole(tmp_path, prefect_env, dask_address):
    marks = tmp_path / "marks"
    marks.mkdir()
    res = subprocess.run([sys.executable, "-c", LOST_WORKER, str(tmp_path / "out"), str(marks), dask_address],
                         cwd=tmp_path, env=prefect_env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [{"chunk": i, "square": i * i} for i in range(4)]
    runs = {p.name: len(p.read_text()) for p in marks.iterdir()}
    assert runs["chunk-2"] == 2  # rerun on the surviving (or restarted) worker
    # The other chunks ran once, or twice where the dead worker still held a result not yet written.
    assert all(1 <= runs[f"chunk-{i}"] <= 2 for i in (0, 1, 3))


# eval_sweep.max_workers bounds how many cells run at once on the local runner (it was validated, never read).
SWEEP_CONCURRENCY = textwrap.dedent("""
    import json, sys, threading, time
    import stages.evaluate
    from pipeline.flows import eval_sweep_flow

    running, peak, lock = 0, 0, threading.Lock()

    def fake_evaluate(params, policy, split, seed, k, temperature, groups=None):
        global running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.5)
        with lock:
            running -= 1
        return [{"group": g, "success": True, "turns": 3, "score": 1.0, "invalid": 0.0} for g in groups]

    stages.evaluate.evaluate_policy = fake_evaluate
    params_file, out, workers = sys.argv[1:]
    eval_sweep_flow(params_file=params_file, checkpoints=["base"], seeds=[0, 1, 2, 3], out_dir=out,
                    overrides={"eval_sweep.max_workers": int(workers)})
    print(json.dumps({"peak": peak}))
""")


@pytest.mark.parametrize("workers", [1, 3])
def test_eval_sweep_runs_max_workers_cells_at_once_on_the_local_runner(tmp_path, prefect_env, workers):
    params_file = write_params(tmp_path / "params.yaml", [*SCRIPTED, f"data_dir={tmp_path / 'data'}"])
    res = subprocess.run([sys.executable, "-c", SWEEP_CONCURRENCY, str(params_file), str(tmp_path / "sweep"),
                          str(workers)], cwd=tmp_path, env=prefect_env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == {"peak": workers}


def test_eval_sweep_on_dask_gives_the_local_rows(tmp_path, prefect_env, dask_address):
    params_file = write_params(tmp_path / "params.yaml", [*SCRIPTED, f"data_dir={tmp_path / 'data'}"])
    sweeps = {}
    for kind in ("local", "dask"):
        curio(["eval-sweep", "-p", str(params_file), "--checkpoint", "base", "--seed", "0", "--seed", "1",
               "-S", f"runner.kind={kind}", "-S", f"runner.address={dask_address}",
               "-S", f"data_dir={tmp_path / kind}"], tmp_path, prefect_env)
        sweeps[kind] = json.loads((tmp_path / kind / "eval_sweep" / "results.json").read_text())
    assert sweeps["dask"] == sweeps["local"] and len(sweeps["local"]) == 2 * 3  # 2 seeds × (2 groups + all)

