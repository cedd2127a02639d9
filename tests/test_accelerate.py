"""Multi-process training under `accelerate launch`: 2 CPU processes (gloo, data-parallel) follow the loss curve
of 1 process at the same global batch, for TRL's SFT and DPO trainers as the stages call them and for rl-text's
own actor-critic loop (ArCHer, CHAI); a killed 2-process rl-text run resumes."""

import copy
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import SMALL, curio, make_project

from pipeline.core.artifacts import read_manifest, read_rows
from pipeline.core.config import ConfigError
from pipeline.core.processes import use_processes
from pipeline.core.stage import StageContext, declaration, stage_module
from pipeline.core.tracking import Tracker
from pipeline.models import tiny
from pipeline.models.training import dpo_train, sft_train, tokenize_pair
from pipeline.params import load_params

ANIMALS = ["cat", "dog", "owl", "fox", "bee", "cow", "eel", "yak", "ant", "bat"]


def conversation(i: int) -> list[dict]:
    a, b = ANIMALS[i % 10], ANIMALS[(3 * i + 1) % 10]
    return [{"role": "system", "content": "Guess the animal."},
            {"role": "user", "content": f"Clue {i}: it is not a {b}."},
            {"role": "assistant", "content": f"<Answer>Is it a {a}?</Answer>"}, {"role": "user", "content": "Yes."}]


@pytest.fixture(scope="module")
def tiny_lm():
    texts = [tiny.conversation_text(conversation(i)) for i in range(40)]
    tok = tiny.train_tokenizer(texts, 300)
    return tiny.build_model(tok, n_layer=1, n_embd=32, n_head=2, n_positions=128, seed=0), tok


def test_sft_on_two_gloo_processes_follows_the_one_process_loss_curve(tiny_lm, tmp_path):
    model, tok = tiny_lm
    convs = [conversation(i) for i in range(40)]
    kw = dict(lr=5e-3, epochs=2, batch_size=4, warmup_ratio=0.0, seed=0, save_steps=1000)
    _, one, _ = sft_train(copy.deepcopy(model), tok, convs, tmp_path / "one", **kw)
    with use_processes(2):
        trained, two, resumed = sft_train(copy.deepcopy(model), tok, convs, tmp_path / "two", **kw)
    assert [h["step"] for h in two] == [h["step"] for h in one] == [5, 10, 15, 20]  # 40 / 4 = 10 steps an epoch
    assert [h["loss"] for h in two] == pytest.approx([h["loss"] for h in one], rel=0.03)
    assert one[-1]["loss"] < 0.75 * one[0]["loss"] and resumed == 0  # it learned; a fresh start
    assert type(trained).__name__ == "GPT2LMHeadModel"  # the trained model comes back to the stage's process


@pytest.mark.slow  # a second launch of 2 processes (~40 CPU-seconds); the SFT test above is the default tier's
def test_dpo_on_two_gloo_processes_follows_the_one_process_loss_curve(tiny_lm, tmp_path):
    model, tok = tiny_lm
    pairs = []
    for i in range(24):
        chosen, rejected = conversation(i), conversation(i + 5)
        p = tokenize_pair(tok, chosen[:2], chosen[2:], rejected[2:])
        pairs.append({**p, "ref_chosen_logps": -20.0, "ref_rejected_logps": -20.0})
    kw = dict(lr=5e-3, epochs=2, batch_size=4, beta=0.1, rpo_alpha=0.0, warmup_ratio=0.0, seed=0, save_steps=1000)
    _, one, _ = dpo_train(copy.deepcopy(model), tok, pairs, tmp_path / "one", **kw)
    with use_processes(2):
        _, two, _ = dpo_train(copy.deepcopy(model), tok, pairs, tmp_path / "two", **kw)
    assert [h["step"] for h in two] == [h["step"] for h in one] == [5, 10]  # 24 / 4 = 6 steps an epoch
    assert [h["loss"] for h in two] == pytest.approx([h["loss"] for h in one], rel=0.03)


# -- rl-text's ArCHer / CHAI: their own actor-critic loop, each process playing and training its share ---------
RL = ["tracking.enabled=false", "rollout_text.temperature=0",  # greedy: a_π and the episodes are deterministic
      "rl_text.rounds=2", "rl_text.tasks_per_round=4", "rl_text.trajectories_per_task=1",
      "rl_text.critic.steps=4", "rl_text.critic.batch_size=8",
      "rl_text.archer.actor_steps=2", "rl_text.archer.batch_size=4", "rl_text.archer.warmup_rounds=0",
      "rl_text.chai.num_samples=2"]
# 1 vs 2 processes differ by float summation order only (the halves' means averaged, DDP's all-reduce): measured
# ≤ 1.4e-7 relative on every round's losses and ≤ 1.5e-8 on the critic's weights. The policy's weights move by
# ~lr per Adam step, where a near-zero gradient's sign may flip with the order: its update is compared as a whole.
LOSS_TOL, CRITIC_ATOL, UPDATE_TOL = 1e-5, 1e-6, 1e-2


class Logged(Tracker):
    """Keeps what a stage logs: metric name -> [(step, value)]."""

    def __init__(self):
        super().__init__()
        self.metrics = {}

    def log_metrics(self, metrics, step=None):
        for k, v in metrics.items():
            self.metrics.setdefault(k, []).append((step, v))


def rl_params(trained: Path, root: Path, *overrides: str):
    """rl-text's params on a data dir of its own that starts from the tiny pipeline run's DPO policy."""
    data = root / "data"
    (data / "train_policy").mkdir(parents=True)
    (data / "train_policy" / "dpo").symlink_to(trained / "data" / "train_policy" / "dpo")
    return load_params(trained / "params.yaml", [f"data_dir={data}", f"metrics_dir={root / 'metrics'}", *RL,
                                                 *overrides])


def run_rl_text(params, processes: int):
    tracker = Logged()
    with use_processes(processes):
        result = stage_module("rl-text").run(declaration("rl-text").slice(params), StageContext(tracker=tracker))
    return result, tracker.metrics


@pytest.fixture(scope="module")
def archer_runs(trained, tmp_path_factory):
    """ArCHer (3 rounds: one critic-only, two with actor steps) in 1 process and in 2 gloo processes."""
    runs = {}
    for processes in (1, 2):
        params = rl_params(trained, tmp_path_factory.mktemp(f"archer{processes}"), "rl_text.algorithm=archer")
        result, logged = run_rl_text(params, processes)
        runs[processes] = {"params": params, "result": result, "logged": logged, "out": params.data_path("rl_text")}
    return runs


def test_archer_on_two_gloo_processes_follows_the_one_process_curves(archer_runs):
    one, two = archer_runs[1], archer_runs[2]
    # the episodes: each process plays half of a round, gathered back in order; round 0 is played by the
    # starting policy, greedily: the same rows as one process plays
    rows = {n: read_rows(run["out"] / "replay") for n, run in archer_runs.items()}
    assert rows[1] and [r for r in rows[2] if r["round"] == 0] == [r for r in rows[1] if r["round"] == 0]
    assert len(rows[2]) == len(rows[1])
    # the same global batches (sampled by the main process as one process does), each process computing half:
    # DDP's averaged gradient is the one-process gradient up to float summation order
    for key in ("rl/critic_loss", "rl/actor_loss"):
        c1, c2 = one["logged"][key], two["logged"][key]
        assert [s for s, _ in c1] == [s for s, _ in c2] == [0, 1]
        assert [v for _, v in c2] == pytest.approx([v for _, v in c1], rel=LOSS_TOL)
    assert one["logged"]["rl/critic_loss"][1][1] < one["logged"]["rl/critic_loss"][0][1]  # the critic learns
    assert_same_critic(one["out"] / "state" / "round-001", two["out"] / "state" / "round-001")
    init = one["params"].data_path("train_policy", "dpo")
    u1, u2 = (policy_update(init, run["out"] / "model") for run in (one, two))
    assert u1.norm() > 0 and (u2 - u1).norm() <= UPDATE_TOL * u1.norm()  # the actor stepped, the same way
    assert two["result"].metrics["rl/transitions"] == one["result"].metrics["rl/transitions"] > 0


def assert_same_critic(a_dir: Path, b_dir: Path) -> None:
    from safetensors.torch import load_file

    for part in ("critic/heads.safetensors", "target/heads.safetensors"):
        a, b = load_file(str(a_dir / part)), load_file(str(b_dir / part))
        assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=CRITIC_ATOL) for k in a), part


def policy_update(init: Path, trained: Path) -> torch.Tensor:
    """Trained minus initial weights, flattened."""
    from safetensors.torch import load_file

    a, b = load_file(str(init / "model.safetensors")), load_file(str(trained / "model.safetensors"))
    return torch.cat([(b[k] - a[k]).flatten() for k in sorted(a) if k in b])


def test_rl_text_refuses_a_batch_the_processes_cannot_split(trained, tmp_path):
    params = rl_params(trained, tmp_path, "rl_text.algorithm=archer", "rl_text.archer.batch_size=3")
    with pytest.raises(ConfigError, match="2 processes cannot split rl_text.archer.batch_size=3"):
        run_rl_text(params, 2)
    assert not params.data_path("rl_text", "state").exists()  # refused before anything was written


@pytest.mark.slow  # ~40 s more: the same loop (actor=False) the ArCHer test above covers in the default tier
def test_chai_trains_its_critic_on_two_gloo_processes(trained, tmp_path):
    from pipeline.text.critic import is_chai_model

    runs = {}
    for processes in (1, 2):
        params = rl_params(trained, tmp_path / f"chai{processes}", "rl_text.algorithm=chai")
        runs[processes] = run_rl_text(params, processes)[1], params.data_path("rl_text")
    (one, _), (two, out) = runs[1], runs[2]
    c1, c2 = one["rl/critic_loss"], two["rl/critic_loss"]
    assert [s for s, _ in c2] == [s for s, _ in c1] == [0, 1]
    assert [v for _, v in c2] == pytest.approx([v for _, v in c1], rel=LOSS_TOL)
    assert "rl/actor_loss" not in two and is_chai_model(out / "model")  # the policy as it was, and its critic


@pytest.mark.slow  # a 2-process run killed, resumed by 2 processes and (a copy) by 1 process
def test_a_killed_two_process_archer_run_resumes(trained, archer_runs, tmp_path):
    """`curio stage rl-text` with `train_policy.num_processes=2`, SIGKILLed once round 0 is checkpointed: its
    launched processes stop with it; rerun, it resumes at round 1 and ends as the uninterrupted 2-process run.
    A copy of the killed run's data goes on in one process from the same checkpoint."""
    import psutil

    proj = make_project(tmp_path, [*SMALL, *RL, "rl_text.algorithm=archer", "train_policy.num_processes=2"])
    (proj / "data" / "train_policy").mkdir(parents=True)
    (proj / "data" / "train_policy" / "dpo").symlink_to(trained / "data" / "train_policy" / "dpo")
    out = proj / "data" / "rl_text"
    stage = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "stage", "rl-text"], cwd=proj,
                             env={**os.environ, "TQDM_DISABLE": "1"}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not (out / "state" / "round-000" / "DONE").exists() and stage.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    trainers = psutil.Process(stage.pid).children(recursive=True)
    stage.send_signal(signal.SIGKILL)
    stage.wait()
    assert (out / "state" / "round-000" / "DONE").exists() and not (out / "model").exists(), "not killed mid-run"
    assert len(trainers) >= 3  # accelerate's launcher and its 2 processes
    _, alive = psutil.wait_procs(trainers, timeout=60)
    assert not alive  # they stopped with the stage: nothing races the rerun
    before = read_manifest(out / "replay")
    shutil.copytree(proj / "data", tmp_path / "copy" / "data", symlinks=True)

    curio(["stage", "rl-text"], proj)
    after = read_manifest(out / "replay")
    assert after["complete"] and all(after["parts"][k]["sha256"] == v["sha256"] for k, v in before["parts"].items())
    straight = archer_runs[2]["out"]
    assert read_rows(out / "replay") == read_rows(straight / "replay")
    assert_same_critic(out / "state" / "round-001", straight / "state" / "round-001")
    init = proj / "data" / "train_policy" / "dpo"
    u, u2 = policy_update(init, out / "model"), policy_update(init, straight / "model")
    assert (u - u2).norm() <= UPDATE_TOL * u2.norm()

    # the checkpoint on disk is the one-process run's: one process resumes it
    params = load_params(proj / "params.yaml", [f"data_dir={tmp_path / 'copy' / 'data'}",
                                                f"metrics_dir={tmp_path / 'copy' / 'metrics'}"])
    _, logged = run_rl_text(params, 1)
    assert [s for s, _ in logged["rl/critic_loss"]] == [1]  # round 0 was not played or trained again
    assert logged["rl/critic_loss"][0][1] == pytest.approx(archer_runs[2]["logged"]["rl/critic_loss"][1][1],
                                                           rel=LOSS_TOL)
