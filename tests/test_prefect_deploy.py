"""prefect.yaml: `prefect deploy --all` into a process work pool, runs picked up by `prefect worker start`, against
a real Prefect server on 127.0.0.1 (own PREFECT_HOME, random port). Tiny runs: a scripted policy, two tasks."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from conftest import REPO, make_project

# A pipeline run of evaluate-text only, and a 1 checkpoint x 2 seeds sweep, with the scripted policy.
OVERRIDES = {"tracking.enabled": False, "policy.backend": "scripted", "policy.model": "scripted:0.4",
             "games.max_eval_tasks": 2, "evaluate_text.policies": ["base"], "evaluate_text.trajectories_per_task": 1}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(url: str, path: str, body: dict | None = None, attempts: int = 6) -> dict | list:
    """One call of the server's REST API. A busy server (its SQLite database locked by another writer) answers 503:
    retried with backoff on 429 / 502 / 503, as Prefect's own client does."""
    for attempt in range(attempts):
        req = urllib.request.Request(url + path, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"}, method="POST" if body is not None
                                     else "GET")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code not in (429, 502, 503) or attempt == attempts - 1:
                raise
            time.sleep(2**attempt)
    raise AssertionError("unreachable")


def _wait_healthy(url: str, server: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert server.poll() is None, "prefect server exited"
        try:
            _api(url, "/health")
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError("prefect server not healthy")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_deployments_run_through_a_worker_and_leave_params_yaml_alone(tmp_path, prefect_home):
    project = make_project(tmp_path, [])
    shutil.copy(REPO / "prefect.yaml", project / "prefect.yaml")
    before = (project / "params.yaml").read_bytes()
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    prefect = str(Path(sys.executable).with_name("prefect"))
    env = {**os.environ, "PREFECT_HOME": str(prefect_home), "PREFECT_API_URL": url,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONPATH": str(project), "TQDM_DISABLE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - closed with the processes below
    server = subprocess.Popen([prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, cwd=project, stdout=log, stderr=subprocess.STDOUT)
    worker = None
    try:
        _wait_healthy(url, server)

        def cli(*args: str) -> str:
            res = subprocess.run([prefect, *args], env=env, cwd=project, capture_output=True, text=True, timeout=300)
            assert res.returncode == 0, f"prefect {' '.join(args)}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
            return res.stdout

        _api(url, "/work_pools/", {"name": "curio", "type": "process"})  # = prefect work-pool create curio …
        cli("--no-prompt", "deploy", "--all")
        flows = {f["id"]: f["name"] for f in _api(url, "/flows/filter", {})}
        deployments = {f"{flows[d['flow_id']]}/{d['name']}": d["id"] for d in _api(url, "/deployments/filter", {})}
        assert set(deployments) == {"pipeline/default", "eval-sweep/default"}
        worker = subprocess.Popen([prefect, "worker", "start", "--pool", "curio"], cwd=project, stdout=log,
                                  stderr=subprocess.STDOUT, env={**env, "PREFECT_WORKER_QUERY_SECONDS": "1"})

        # = prefect deployment run NAME -p overrides='{…}' -p …; both queued at once, the worker runs them.
        # The third, a typo of a stage name, is refused in one line and creates nothing.
        started = [_api(url, f"/deployments/{deployments[name]}/create_flow_run", {"parameters": parameters})["id"]
                   for name, parameters in (
                       ("pipeline/default", {"overrides": OVERRIDES, "stages": ["evaluate-text"]}),
                       ("eval-sweep/default", {"overrides": OVERRIDES, "checkpoints": ["base"], "seeds": [0, 1]}),
                       ("pipeline/default", {"overrides": OVERRIDES, "stages": ["evalute-text"]}))]
        deadline = time.time() + 400
        while time.time() < deadline:
            states = [_api(url, f"/flow_runs/{i}")["state_type"] for i in started]
            if all(s in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"} for s in states):
                break
            time.sleep(1)

        refused = _api(url, f"/flow_runs/{started.pop()}")
        assert refused["state_type"] == "FAILED"
        assert refused["state"]["message"].startswith("unknown stage 'evalute-text' (did you mean 'evaluate-text'?)")
        runs = [r for r in _api(url, "/flow_runs/filter", {}) if r["id"] != refused["id"]]
        assert {r["state_type"] for r in runs} == {"COMPLETED"}, [(r["name"], r["state_type"]) for r in runs]
        # Each stage of the pipeline is a named subflow run; each sweep cell a named task run.
        assert "evaluate-text seed=0" in {r["name"] for r in runs}
        tasks = {t["name"] for t in _api(url, "/task_runs/filter", {})}
        assert {"evaluate base eval seed=0", "evaluate base eval seed=1"} <= tasks
        artifacts = {a["key"]: a for a in _api(url, "/artifacts/filter", {}) if a.get("key")}
        assert {"pipeline-summary", "eval-sweep-table", "eval-sweep-results"} <= set(artifacts)
        table = artifacts["eval-sweep-table"]["data"]
        table = json.loads(table) if isinstance(table, str) else table
        assert table[0]["checkpoint"] == "base" and table[0]["seeds"] == 2

        # Overrides never rewrite params.yaml; the overridden pipeline run wrote into data/prefect/<run>/.
        assert (project / "params.yaml").read_bytes() == before
        written = list((project / "data" / "prefect").glob("*/metrics/stages/evaluate-text.json"))
        assert len(written) == 1 and json.loads(written[0].read_text())["base/episodes"] == 2
        assert len(list((project / "data" / "prefect").iterdir())) == 1  # nothing from the refused run
        assert not (project / "metrics").exists() and not (project / "data" / "evaluate_text").exists()
    finally:
        if worker is not None:
            _stop(worker)
        _stop(server)
        log.close()
