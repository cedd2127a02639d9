"""The text track end to end on a small config: real stages, real kills, real DVC / Prefect / MLflow."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import NETHACK_TINY, RUN_LOG, SMALL, TEXT_STAGES, judge_sources, make_project, stage_here

from pipeline.core.artifacts import read_manifest, read_rows
from pipeline.core.dag import commands
from pipeline.core.registry import STAGES

# The resume tests below leave MLflow off: a killed stage's run and its tracking process are
# tests/test_tracking_process.py's, and the tracking process each stage would start costs 4-5 s of CPU.
UNTRACKED = ["tracking.enabled=false"]


def start(args, cwd):
    env = {**os.environ, "TQDM_DISABLE": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{cwd}/mlflow.db"}
    return subprocess.Popen([sys.executable, "-m", "pipeline.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kill_when(proc, predicate, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    proc.kill()
    return False


def test_every_stage_produces_its_outputs(trained):
    # each stage ran as `make run` runs it: DVC ran its command, in a copy of the warm start's server
    # (pipeline/stage_server.py)
    log = (trained / RUN_LOG).read_text().splitlines()
    ran = [m.group(1) for line in log if (m := re.match(r"Running stage '([\w-]+)'", line))]
    assert sorted(ran) == sorted(["check-params", *TEXT_STAGES])
    served = [line.split("`")[1] for line in log if "runs in a copy" in line]
    assert served == [commands(trained / "dvc.yaml")[name] for name in ran]
    rows = read_rows(trained / "data" / "rollout_text")
    assert len(rows) == 12 * 4
    assert {r["split"] for r in rows} == {"train"}
    assert all(r["conversation"][0]["role"] == "system" for r in rows)
    pairs = read_rows(trained / "data" / "reflogprobs")
    assert pairs and all(p["ref_chosen_logps"] < 0 and p["ref_rejected_logps"] < 0 for p in pairs)
    metrics = json.loads((trained / "metrics" / "stages" / "evaluate-text.json").read_text())
    for policy in ("base", "sft", "dpo", "rl"):
        assert 0.0 <= metrics[f"{policy}/success_rate"] <= 1.0
        assert metrics[f"{policy}/episodes"] == 6
    evaluated = read_rows(trained / "data" / "evaluate_text")
    assert {r["split"] for r in evaluated} == {"eval"}
    assert (trained / "metrics" / "plots" / "eval.png").stat().st_size > 1000
    assert (trained / "data" / "train_policy" / "dpo" / "model.safetensors").exists()
    margins = read_rows(trained / "data" / "train_policy" / "dpo_margins")  # the trained policy's, on every pair
    assert [m["pair"] for m in margins] == list(range(len(pairs)))
    assert all(m["prefers_chosen"] == (m["implicit_margin"] > 0) for m in margins)


def test_rollout_resumes_after_sigkill_with_identical_rows(trained, tmp_path):
    proj = make_project(tmp_path, [*SMALL, *UNTRACKED])
    (proj / "data").mkdir()
    os.symlink(trained / "data" / "bootstrap", proj / "data" / "bootstrap")
    proc = start(["stage", "rollout-text"], proj)
    manifest = proj / "data" / "rollout_text"

    def some_parts():
        m = read_manifest(manifest)
        return m is not None and 1 <= len(m["parts"]) < 3

    assert kill_when(proc, some_parts), "rollout finished before it could be killed"
    before = read_manifest(manifest)
    assert not before["complete"]
    kept = {k: v["sha256"] for k, v in before["parts"].items()}
    stage_here("rollout-text", proj)
    after = read_manifest(manifest)
    assert after["complete"] and all(after["parts"][k]["sha256"] == sha for k, sha in kept.items())
    assert read_rows(manifest) == read_rows(trained / "data" / "rollout_text")


def test_training_resumes_from_checkpoint(trained, tmp_path):
    proj = make_project(tmp_path, [*SMALL, *UNTRACKED, "train_policy.sft.epochs=6"])
    (proj / "data").mkdir()
    for name in ("bootstrap", "pairs_text"):
        os.symlink(trained / "data" / name, proj / "data" / name)
    proc = start(["stage", "train-sft"], proj)
    ckpt = proj / "data" / "train_policy" / "sft" / "checkpoints"
    has_ckpt = lambda: ckpt.exists() and any(  # noqa: E731
        (p / "trainer_state.json").exists() for p in ckpt.glob("checkpoint-*"))
    assert kill_when(proc, has_ckpt), "SFT finished before a checkpoint could be killed"
    stage_here("train-sft", proj)
    metrics = json.loads((proj / "metrics" / "stages" / "train-sft.json").read_text())
    assert metrics["sft/resumed_from_step"] >= 2
    assert (proj / "data" / "train_policy" / "sft" / "DONE").exists() and not ckpt.exists()


def test_dpo_reference_is_the_policy_it_starts_from(trained, tmp_path, monkeypatch):
    """reflogprobs scored the pairs with the SFT policy DPO starts from, so DPO's first loss is log 2 (β-scaled
    margins of zero) from the stored log-probs, with one model trained (the policy) and no reference model."""
    import math

    import stages.train_dpo as train_dpo
    from pipeline.core.config import ConfigError
    from pipeline.core.stage import execute
    from pipeline.llm.hf import load_policy
    from pipeline.models import training
    from pipeline.models.training import sequence_logps
    from pipeline.params import load_params

    pairs = read_rows(trained / "data" / "reflogprobs")
    sft, _ = load_policy(trained / "data" / "train_policy" / "sft")
    stored = [p["ref_chosen_logps"] for p in pairs]
    scored = sequence_logps(sft, [(p["prompt_ids"], p["chosen_ids"], p["chosen_mask"]) for p in pairs])
    assert scored == pytest.approx(stored, rel=1e-4)

    proj = make_project(tmp_path, SMALL)
    (proj / "data" / "train_policy").mkdir(parents=True)
    for name in ("bootstrap", "reflogprobs", "train_policy/sft"):
        os.symlink(trained / "data" / name, proj / "data" / name)
    monkeypatch.chdir(proj)
    loads, trainers = [], []
    monkeypatch.setattr(train_dpo, "load_policy", lambda *a, **k: loads.append(a[0]) or load_policy(*a, **k))
    real_trained_model = training.trained_model
    monkeypatch.setattr(training, "trained_model", lambda t, m=True: trainers.append(t) or real_trained_model(t, m))
    # a negligible lr and one pair per step: the first logged loss (mean of steps 1-5) is the loss at the start
    params = load_params("params.yaml", ["tracking.enabled=false", "train_policy.dpo.lr=1e-12",
                                         "train_policy.dpo.rpo_alpha=0", "train_policy.dpo.batch_size=1",
                                         "train_policy.dpo.epochs=5"])
    execute("train-dpo", params)
    history = json.loads((proj / "metrics" / "plots" / "dpo_loss.json").read_text())
    assert history[0]["loss"] == pytest.approx(math.log(2), rel=1e-3)
    # one model trains (the policy it starts from; no reference model), then the trained one scores the pairs'
    # implicit reward margins (data/train_policy/dpo_margins)
    assert [Path(p).name for p in loads] == ["sft", "dpo"] and trainers[0].ref_model is None
    # a reference scored by another policy than DPO starts from is refused
    with pytest.raises(ConfigError, match="not scored by the policy DPO starts from"):
        execute("train-dpo", load_params("params.yaml", ["tracking.enabled=false", "train_policy.dpo.init=base"]))


def test_prefect_pipeline_keeps_dvc_lock_consistent_and_dvc_reruns_what_changed(trained, chain, nethack_track,
                                                                               tmp_path, prefect_home):
    """`curio pipeline` (Prefect) over every stage of both tracks leaves dvc.lock consistent (`dvc repro` then runs
    nothing) with one MLflow run per stage nested under the pipeline run; then a changed param or source file
    makes `dvc status` name the stages that read it, and only those.

    The stages' tiny outputs are copied in from the session's runs, so each stage resumes to completion in
    seconds (its params hash and inputs unchanged): the DVC / Prefect / MLflow bookkeeping is what runs."""
    import shutil

    import yaml

    proj = make_project(tmp_path, SMALL + [o for o in NETHACK_TINY if not o.startswith("tracking.")])
    nethack = [chain.data_path(name) for name in ("rollout_nethack", "annotate_nethack", "pairs_nethack",
                                                   "reward_model")]
    nethack += [nethack_track.data_path(name) for name in ("rl_nethack", "evaluate_nethack")]
    for src in [*(p for p in (trained / "data").iterdir() if p.is_dir()), *nethack]:
        shutil.copytree(src, proj / "data" / src.name)
    env = {**os.environ, "TQDM_DISABLE": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{proj}/mlflow.db",
           "PREFECT_HOME": str(prefect_home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), cwd=proj, env=env, capture_output=True, text=True)

    assert run("dvc", "init", "--no-scm", "-q").returncode == 0
    res = run(sys.executable, "-m", "pipeline.cli", "pipeline")
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(run("dvc", "status", "--json").stdout) == {}
    repro = run("dvc", "repro")
    assert repro.returncode == 0 and "Running stage" not in repro.stdout

    import mlflow

    client = mlflow.tracking.MlflowClient(f"sqlite:///{proj}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("curio").experiment_id])
    parent = [r for r in runs if r.data.tags.get("curio.kind") == "pipeline"]
    children = [r for r in runs if r.data.tags.get("curio.stage")]
    assert len(parent) == 1
    assert sorted(r.data.tags["curio.stage"] for r in children) == sorted(STAGES)
    assert all(r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id for r in children)

    def changed_by(edit) -> set[str]:
        before = {p: p.read_bytes() for p in (proj / "params.yaml", *(proj / "pipeline").rglob("*"))
                  if p.is_file()}
        edit()
        status = json.loads(run("dvc", "status", "--json").stdout)
        for path, content in before.items():
            path.write_bytes(content)
        # check-params reads every param: it reruns on any edit, and its unchanged stamp reruns nothing else
        return set(status) - {"check-params"}

    def set_param(key: str, value) -> None:
        from pipeline.core.config import _set_dotted

        raw = yaml.safe_load((proj / "params.yaml").read_text())
        _set_dotted(raw, key, value)
        (proj / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))

    def touch(relative: str) -> None:
        path = next(p for p in sorted((proj / relative).rglob("*")) if p.is_file()) if (proj / relative).is_dir() \
            else proj / relative
        path.write_bytes(path.read_bytes() + b"\n")

    # the judge's params, code and prompts are annotate-text's (bug: its prompt edits used to rerun nothing)
    assert changed_by(lambda: set_param("annotate_text.judge.max_tokens", 64)) == {"annotate-text"}
    for source in judge_sources():
        assert "annotate-text" in changed_by(lambda s=source: touch(s)), source
    # evaluate-text samples with rollout_text.min_p (bug: a change used to rerun nothing there)
    assert changed_by(lambda: set_param("rollout_text.min_p", 0.1)) == {
        "rollout-text", "pairs-text", "rl-text", "evaluate-text"}
    assert changed_by(lambda: set_param("evaluate_nethack.episodes", 3)) == {"evaluate-nethack"}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_eval_sweep_deployment_on_a_real_prefect_server(trained, tmp_path, prefect_home):
    """`prefect server start` on loopback, `curio serve`, `prefect deployment run 'eval-sweep/default'`."""
    import urllib.request

    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(prefect_home), "PREFECT_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "TQDM_DISABLE": "1",
           "MLFLOW_TRACKING_URI": f"sqlite:///{trained}/mlflow.db"}
    bindir = os.path.dirname(sys.executable)
    server = subprocess.Popen([f"{bindir}/prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    served = None
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{api}/health", timeout=2)
                break
            except OSError:
                assert time.time() < deadline, "prefect server did not become healthy"
                time.sleep(0.5)
        served = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "serve"], cwd=trained, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        params = json.dumps({"checkpoints": ["base", "dpo"], "seeds": [0, 1], "out_dir": str(tmp_path / "sweep")})
        deadline = time.time() + 120
        while True:  # the deployment exists once `curio serve` has registered it
            run = subprocess.run([f"{bindir}/prefect", "deployment", "run", "eval-sweep/default", "--params",
                                  params, "--watch", "--watch-timeout", "300"],
                                 env=env, capture_output=True, text=True, timeout=360)
            if run.returncode == 0 or time.time() > deadline or "not found" not in (run.stdout + run.stderr):
                break
            time.sleep(2)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        assert "Completed" in run.stdout
        rows = json.loads((tmp_path / "sweep" / "results.json").read_text())
        assert {(r["checkpoint"], r["seed"]) for r in rows} == {("base", 0), ("base", 1), ("dpo", 0), ("dpo", 1)}
        assert "| checkpoint |" in (tmp_path / "sweep" / "results.md").read_text()
    finally:
        for proc in (served, server):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()


ARCHER = ["rl_text.algorithm=archer", "rl_text.rounds=2", "rl_text.critic.steps=2", "rl_text.critic.batch_size=4",
          "rl_text.archer.actor_steps=1", "rl_text.archer.batch_size=2", "rl_text.archer.warmup_rounds=1"]


def test_archer_resumes_after_sigkill_as_if_never_killed(trained, tmp_path):
    """`curio stage rl-text` with ArCHer, SIGKILLed after its first round's checkpoint, then rerun: the replay
    buffer's parts written before the kill are kept byte for byte, and the final policy and critic equal an
    uninterrupted run's exactly (every round re-seeds; optimiser states are restored)."""
    from safetensors.torch import load_file

    runs = {}
    for name in ("straight", "killed"):
        (tmp_path / name).mkdir()
        proj = make_project(tmp_path / name, [*SMALL, *UNTRACKED, *ARCHER])
        (proj / "data").mkdir()
        os.symlink(trained / "data" / "train_policy", proj / "data" / "train_policy")
        runs[name] = proj
    stage_here("rl-text", runs["straight"])
    out = runs["killed"] / "data" / "rl_text"
    proc = start(["stage", "rl-text"], runs["killed"])
    first_round = lambda: (out / "state" / "round-000" / "DONE").exists()  # noqa: E731
    assert kill_when(proc, first_round, timeout=900), "rl-text finished before it could be killed"
    before = read_manifest(out / "replay")
    assert not before["complete"] and not (out / "model").exists()
    stage_here("rl-text", runs["killed"])
    after = read_manifest(out / "replay")
    assert after["complete"] and all(after["parts"][k]["sha256"] == v["sha256"] for k, v in before["parts"].items())
    straight = runs["straight"] / "data" / "rl_text"
    assert read_rows(out / "replay") == read_rows(straight / "replay")
    for f in ("model/model.safetensors", "state/round-001/critic/heads.safetensors",
              "state/round-001/target/encoder/model.safetensors"):
        a, b = load_file(str(out / f)), load_file(str(straight / f))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f
    straight_policy = load_file(str(straight / "model" / "model.safetensors"))
    init = load_file(str(trained / "data" / "train_policy" / "dpo" / "model.safetensors"))
    assert any(not torch.equal(straight_policy[k], init[k]) for k in init if k in straight_policy), \
        "the actor steps after the warm-up round changed no weight"
    metrics = json.loads((out.parent.parent / "metrics" / "stages" / "rl-text.json").read_text())
    assert metrics["rl/transitions"] > 0 and "rl/actor_loss" in metrics
    history = json.loads((out.parent.parent / "metrics" / "plots" / "rl_rounds.json").read_text())
    assert [h["episodes"] for h in history] == [8, 16]  # environment samples so far: 4 tasks x 2 per round
