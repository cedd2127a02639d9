"""Chunked stages and the eval-sweep on Prefect's Dask and Ray task runners give the local runner's rows.

tests/runner_script.py starts a real Dask scheduler with 2 worker processes on 127.0.0.1 and a real Ray head
(started by the runner, shut down when its run ends) and runs everything cluster-side in one process (one
Prefect API); the local references are computed here. Play uses the games' scripted player: seconds per run.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from pipeline.core.artifacts import read_rows
from pipeline.core.config import _set_dotted, parse_override
from pipeline.core.stage import execute
from pipeline.params import load_params

SCRIPTED = [
    "tracking.enabled=false", "policy.backend=scripted", "policy.model=scripted:0.4",
    "games.groups=[wordle,mastermind]", "games.max_train_tasks=5", "games.max_eval_tasks=3",
    "rollout_text.trajectories_per_task=2", "rollout_text.tasks_per_chunk=2", "evaluate_text.trajectories_per_task=2",
    "evaluate_text.policies=[base]",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, migrated_prefect_home) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("runners")
    shutil.copytree(migrated_prefect_home, root / "prefect")
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    for o in SCRIPTED:
        _set_dotted(raw, *parse_override(o))
    params_file = root / "params.yaml"
    params_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {**os.environ, "PREFECT_HOME": str(root / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1"}
    res = subprocess.run([sys.executable, str(REPO / "tests" / "runner_script.py"), str(params_file), str(root)],
                         cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-6000:]
    print("runner_script seconds:", res.stdout.strip().splitlines()[-1])
    return root, json.loads((root / "summary.json").read_text())


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("local") / "data"
    params = load_params(REPO / "params.yaml", [*SCRIPTED, f"data_dir={data}"])
    for stage in ("rollout-text", "annotate-text", "evaluate-text"):
        execute(stage, params)
    return data


def test_runner_section_validates_and_local_is_the_default():
    assert load_params(REPO / "params.yaml").runner.kind == "local"
    with pytest.raises(ValueError, match="runner.kind"):
        load_params(REPO / "params.yaml", ["runner.kind=slurm"])


def test_chunked_stages_on_dask_write_the_local_rows(runs, local):
    root, summary = runs
    for out in ("rollout_text", "annotate_text", "evaluate_text"):
        assert read_rows(root / "dask" / out) == read_rows(local / out), out
    manifest = json.loads((root / "dask" / "rollout_text" / "_manifest.json").read_text())
    assert manifest["complete"] and manifest["num_parts"] == 5  # 10 tasks, 2 per chunk: a part per chunk
    # a worker that played chunks keeps the one policy it loaded for its next chunks (none is shipped)
    assert sum(summary["cached_per_worker"]) >= 1 and set(summary["cached_per_worker"]) <= {0, 1}


def test_rollout_on_a_local_ray_head_writes_the_local_rows(runs, local):
    root, _ = runs
    assert read_rows(root / "ray" / "rollout_text") == read_rows(local / "rollout_text")


def test_a_worker_lost_mid_chunk_costs_that_chunk_and_the_rows_are_whole(runs):
    _, summary = runs
    assert summary["lost_rows"] == [{"chunk": i, "square": i * i} for i in range(4)]
    runs_of = summary["lost_runs"]
    assert runs_of["chunk-2"] == 2  # rerun on the surviving (or restarted) worker
    # the other chunks ran once, or twice where the dead worker still held a result not yet written
    assert all(1 <= runs_of[f"chunk-{i}"] <= 2 for i in (0, 1, 3))


def test_eval_sweep_on_dask_gives_the_local_rows(runs):
    # Against the local runner with one worker: threads of one process share torch's global generator, which
    # play_episodes seeds, so cells run in parallel threads draw from it in whatever order they interleave.
    _, summary = runs
    assert summary["sweep_dask"] == summary["sweep_local"] and len(summary["sweep_local"]) == 2 * 3  # seeds × (2 + all)


def test_eval_sweep_runs_max_workers_cells_at_once_on_the_local_runner(runs):
    # eval_sweep.max_workers was validated but never read (the flow ran 2 threads whatever it said)
    _, summary = runs
    assert summary["peak_cells"] == {"1": 1, "3": 3}
