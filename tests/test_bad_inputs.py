"""Bad input, as a new user would give it: malformed params, corrupted files and models, a broken cache, a
faulty LLM server. Each case ends in exit 2 (3: server unavailable) with one line and no traceback, or in a
correct recompute; and nothing good is overwritten on the way.

CLI cases run in-process (typer's CliRunner on ``pipeline.cli.app``: the same code as the ``curio`` command),
in a scratch project whose ``data/`` holds small hand-made stage outputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sqlite3
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import assert_one_line
from typer.testing import CliRunner

from pipeline import cli
from pipeline.core.artifacts import MANIFEST, MODEL_MANIFEST, ChunkedDataset, read_table, save_model_dir, verify_model
from pipeline.core.config import ConfigError
from pipeline.core.errors import InputError
from pipeline.core.locks import LOCK_DIR
from pipeline.core.runners import run_chunked
from pipeline.llm import make_backend
from pipeline.llm.base import ChatBackend, Generation, Sampling
from pipeline.llm.cache import CachedBackend, ResponseCache
from pipeline.llm.config import LLMConfig
from pipeline.params import load_params

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai_server import CURIO_RULES, FakeServer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
KEY_ENV = "CURIO_TEST_BAD_INPUTS_KEY"

# -- a scratch project with hand-made stage outputs ----------------------------------------------------------
ROLLOUT_SCHEMA = pa.schema([
    ("group", pa.string()), ("task_id", pa.string()), ("secret", pa.string()), ("category", pa.string()),
    ("difficulty", pa.string()), ("split", pa.string()),
    ("conversation", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    ("final_action", pa.string()), ("success", pa.bool_()),
])


def rollout_rows(n: int) -> list[dict]:
    """Finished twenty-questions games; most claim a win (those are the ones a judge is asked about)."""
    rows = []
    for i in range(n):
        secret = f"object{i}"
        guess = secret if i % 3 else "something else"
        rows.append({
            "group": "twenty_questions", "task_id": f"t{i}", "secret": json.dumps(secret), "category": "things",
            "difficulty": "easy", "split": "train",
            "conversation": [{"role": "user", "content": "Ask your question."},
                             {"role": "assistant", "content": f"Is it {guess}? (game {i})"},
                             {"role": "user", "content": "Goal reached" if i % 4 else "No"}],
            "final_action": f"Is it {guess}?", "success": i % 4 != 0,
        })
    return rows


def write_dataset(path: Path, rows: list[dict], schema: pa.Schema | None = None, per_part: int = 8) -> None:
    parts = [rows[i : i + per_part] for i in range(0, len(rows), per_part)]
    run_chunked(path, num_chunks=len(parts), make_chunk=lambda i: parts[i], params_hash="hand-made",
                schema=schema)


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` (what "nothing was overwritten" compares), the lock files of
    pipeline/core/locks.py (``.locks/``, empty, left for the next run) aside."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and LOCK_DIR not in p.relative_to(root).parts}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A project with params.yaml (tracking off), data/rollout_text and a finished data/annotate_text."""
    root = tmp_path_factory.mktemp("template")
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["tracking"]["enabled"] = False
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    write_dataset(root / "data" / "rollout_text", rollout_rows(24), ROLLOUT_SCHEMA)
    cwd = Path.cwd()
    os.chdir(root)
    try:
        assert run(["stage", "annotate-text"]).exit_code == 0
    finally:
        os.chdir(cwd)
    return root


@pytest.fixture
def project(template, tmp_path, monkeypatch):
    """cwd = a fresh copy of the template project."""
    root = tmp_path / "project"
    shutil.copytree(template, root)
    monkeypatch.chdir(root)
    monkeypatch.setenv("CURIO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # hub ids are checked against the local cache only
    monkeypatch.delenv(KEY_ENV, raising=False)
    return root


def run(args: list[str]):
    return CliRunner().invoke(cli.app, args)




# -- params: one line naming the key, exit 2, nothing written ---------------------------------------------------
PARAM_CASES = [
    (["-S", "games.groups=[no_such_game]"], "games.groups"),
    (["-S", "games.eval_groups=[nope]"], "games.eval_groups"),
    (["-S", "eval_sweep.groups=[nope]"], "eval_sweep.groups"),
    (["-S", "policy.model=./no/such/model"], "policy.model"),
    (["-S", "policy.model=SomeOrg/not-in-the-cache"], "policy.model"),
    (["-S", "annotate_text.judge.backend=openai", "-S", "annotate_text.judge.model=x"], "annotate_text.judge.base_url"),
    (["-S", "rollout_text.environment.backend=openai"], "rollout_text.environment.base_url"),
    (["-S", "annotate_nethack.annotator.backend=openai"], "annotate_nethack.annotator.base_url"),
    (["-S", "annotate_text.judge.backend=openai", "-S", "annotate_text.judge.base_url=127.0.0.1:8000"],
     "annotate_text.judge.base_url"),
    (["-S", "annotate_text.judge.backend=openai", "-S", "annotate_text.judge.base_url=http://127.0.0.1:1/v1",
      "-S", f"annotate_text.judge.api_key_env={KEY_ENV}"], KEY_ENV),
    (["-S", "annotate_text.judge.model=no_such_judge"], "annotate_text.judge.model"),
    (["-S", "rollout_text.environment.model=no_such_program"], "rollout_text.environment.model"),
    (["-S", "pairs_text.judge.model=nope"], "pairs_text.judge.model"),
    (["-S", "annotate_nethack.annotator.backend=rules", "-S", "annotate_nethack.annotator.model=nope"],
     "annotate_nethack.annotator.model"),
    (["-S", "annotate_text.judge.backend=embedding"], "annotate_text.judge.backend"),
    (["-S", "annotate_nethack.annotator.model=/no/such/embedder"], "annotate_nethack.annotator.model"),
    (["-S", "annotate_text.judge.backend=hf", "-S", "annotate_text.judge.model=/no/such/judge"],
     "annotate_text.judge.model"),
    (["-S", "annotate_nethack.goal=world_domination"], "annotate_nethack.goal"),
    (["-S", "annotate_nethack.template=nope"], "annotate_nethack.template"),
    (["-S", "evaluate_nethack.policies=[random,ghost]"], "evaluate_nethack.policies"),
    (["-S", "rollout_nethack.policy=checkpoint", "-S", "rollout_nethack.checkpoint=/no/such/dir"],
     "rollout_nethack.checkpoint"),
    (["-S", "policy.backend=openai"], "policy.backend"),
    (["-S", "no_such_section.x=1"], "no_such_section"),
    (["-S", "seed=abc"], "seed"),
    (["-S", "annotate_text.judge.max_attempts=0"], "annotate_text.judge.max_attempts"),
    (["-S", "train_policy.dpo.loss_type=simpo"], "train_policy.dpo.loss_type"),
    (["-S", "games.groups"], "override"),
    (["-S", "data_dir=params.yaml"], "data_dir"),
    (["-S", "metrics_dir=params.yaml"], "metrics_dir"),
    (["-S", "rl_text.reward=bandit"], "rl_text.reward"),  # only the implemented rewards are values
    (["-S", "rl_text.reward=judge", "-S", "games.groups=[wordle]"], "rl_text.reward"),  # rules judge: no knowledge base
    (["-S", "rl_text.curriculum.enabled=true", "-S", "rl_text.trajectories_per_task=1"], "trajectories_per_task"),
    # online RL that trains the weights it plays with, in its process: never silently on hf with another backend
    (["-S", "rl_text.algorithm=archer", "-S", "policy.backend=vllm"], "policy.backend"),
    (["-S", "rl_text.grpo.credit=step"], "rl_text.grpo.credit"),
    (["-S", "rl_text.grpo.rollout_correction_cap=1"], "rl_text.grpo.rollout_correction_cap"),
]


@pytest.mark.parametrize(("args", "key"), PARAM_CASES, ids=[c[1] + f"-{i}" for i, c in enumerate(PARAM_CASES)])
def test_bad_param_is_one_line_exit_2_and_the_good_output_stays(project, args, key):
    before = tree_digest(project / "data")
    assert_one_line(run(["stage", "annotate-text", *args]), key)
    assert tree_digest(project / "data") == before


@pytest.mark.parametrize(("content", "needle"), [
    (b"", "is empty"),
    (b"- a\n- b\n", "must be a mapping"),
    (b"seed: [1, 2\n", "not valid YAML"),
    (b"seed: \xff\xfe\n", "not valid YAML"),
], ids=["empty", "list", "bad-yaml", "not-utf8"])
def test_bad_params_file_is_refused(project, content, needle):
    (project / "bad.yaml").write_bytes(content)
    before = tree_digest(project / "data")
    assert_one_line(run(["stage", "annotate-text", "--params", "bad.yaml"]), "bad.yaml", needle)
    assert tree_digest(project / "data") == before


def test_missing_params_file_and_unknown_stage(project):
    assert_one_line(run(["params", "--params", "nope.yaml"]), "nope.yaml not found")
    assert_one_line(run(["stage", "no-such-stage"]), "unknown stage")


@pytest.mark.parametrize(("stage", "needed"), [("reflogprobs", "train-sft"), ("train-dpo", "train-sft"),
                                                ("rl-text", "train-dpo")])
def test_a_policy_not_trained_yet_names_its_stage_for_a_real_model_too(project, stage, needed):
    """policy.model naming a real Hugging Face directory: the sft / dpo policies are still stage outputs, and a
    stage that needs one before it exists names the stage to run (not a loader's traceback)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    real = project / "real-model"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=1, n_embd=8, vocab_size=64, n_positions=32)).save_pretrained(real)
    before = tree_digest(project / "data")
    assert_one_line(run(["stage", stage, "-S", f"policy.model={real}"]), f"run {needed} first")
    assert tree_digest(project / "data") == before


def test_a_hub_id_in_the_local_cache_is_accepted(project, monkeypatch):
    hub = project / "hf"
    (hub / "models--SomeOrg--cached-model" / "snapshots" / "abc").mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert load_params("params.yaml", ["policy.model=SomeOrg/cached-model"]).policy.model == "SomeOrg/cached-model"
    with pytest.raises(ConfigError, match="policy.model"):
        load_params("params.yaml", ["policy.model=SomeOrg/other-model"])


def test_openai_backend_without_base_url_never_reaches_a_default_endpoint():
    with pytest.raises(ConfigError, match="base_url"):  # even when params were built in code, unchecked
        make_backend(LLMConfig(backend="openai", model="x"), role="judge")


# -- the error boundary --------------------------------------------------------------------------------------
def test_rollouts_that_give_no_pair_are_one_line_exit_2_and_nothing_written(project):
    """Every game lost, twice a task: no task has a chosen and a rejected game. That is the budget's doing (too few
    games a task, a too-hard tier), not a bug: one line naming what to raise."""
    shutil.rmtree(project / "data")
    lost = [{**row, "task_id": f"t{i // 2}", "secret": json.dumps(f"object{i // 2}"), "sample": i % 2,
             "success": False, "invalid": False, "turns": 1, "final_action": "Is it a kettle?"}
            for i, row in enumerate(rollout_rows(8))]
    write_dataset(project / "data" / "rollout_text", lost)
    assert run(["stage", "annotate-text"]).exit_code == 0
    result = run(["stage", "pairs-text"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        "curio: pairs-text: no task has both a chosen and a rejected trajectory; raise "
        "rollout_text.trajectories_per_task or the temperature"]
    assert not (project / "data" / "pairs_text" / "preferences").exists()


def test_a_bug_is_a_traceback_with_a_hint_and_exit_1(project, monkeypatch):
    import stages.annotate_text

    def broken(params, ctx):
        raise ZeroDivisionError("a real bug")

    monkeypatch.setattr(stages.annotate_text, "run", broken)
    result = run(["stage", "annotate-text"])
    assert result.exit_code == 1
    assert "Traceback" in result.stderr and "ZeroDivisionError" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == cli.BUG_HINT


def test_unreachable_server_is_exit_3_and_keeps_finished_output(project):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    before = tree_digest(project / "data" / "annotate_text")
    result = run(["stage", "annotate-text", "-S", "annotate_text.judge.backend=openai",
                  "-S", "annotate_text.judge.model=m", "-S", f"annotate_text.judge.base_url=http://127.0.0.1:{port}/v1",
                  "-S", "annotate_text.judge.max_retries=1", "-S", "annotate_text.judge.backoff_s=0.01"])
    assert_one_line(result, f"127.0.0.1:{port}", "start the server", code=3)
    assert tree_digest(project / "data" / "annotate_text") == before  # the old verdicts are still there


# -- files: consumers verify, producers recompute, good output survives ------------------------------------------
def first_part(path: Path) -> Path:
    return sorted(path.glob("part-*.parquet"))[0]


def corrupt_garbage(ds: Path) -> None:
    first_part(ds).write_bytes(b"this is not parquet")


def corrupt_truncate(ds: Path) -> None:
    part = first_part(ds)
    part.write_bytes(part.read_bytes()[:100])


def corrupt_flip_byte(ds: Path) -> None:
    part = first_part(ds)
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))


def corrupt_delete_part(ds: Path) -> None:
    first_part(ds).unlink()


def corrupt_manifest_json(ds: Path) -> None:
    (ds / MANIFEST).write_text("{ not json")


def corrupt_manifest_bytes(ds: Path) -> None:
    (ds / MANIFEST).write_bytes(b"\xff\xfe\x00garbage")


def corrupt_manifest_shape(ds: Path) -> None:
    (ds / MANIFEST).write_text(json.dumps({"complete": True, "parts": {"00000": {"file": 3}}}))


def corrupt_incomplete(ds: Path) -> None:
    manifest = json.loads((ds / MANIFEST).read_text())
    (ds / MANIFEST).write_text(json.dumps({**manifest, "complete": False}))


def corrupt_delete_dataset(ds: Path) -> None:
    shutil.rmtree(ds)


def corrupt_other_schema(ds: Path) -> None:
    """A valid Parquet part with other columns, its sha updated in the manifest: only the schema check sees it."""
    part = first_part(ds)
    pq.write_table(pa.table({"group": [1, 2], "x": ["a", "b"]}), part)
    manifest = json.loads((ds / MANIFEST).read_text())
    info = manifest["parts"]["00000"]
    info["sha256"] = hashlib.sha256(part.read_bytes()).hexdigest()
    (ds / MANIFEST).write_text(json.dumps(manifest))


CORRUPTIONS = [corrupt_garbage, corrupt_truncate, corrupt_flip_byte, corrupt_delete_part, corrupt_manifest_json,
               corrupt_manifest_bytes, corrupt_manifest_shape, corrupt_incomplete, corrupt_delete_dataset,
               corrupt_other_schema]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=[c.__name__.removeprefix("corrupt_") for c in CORRUPTIONS])
def test_corrupt_input_names_the_stage_to_rerun_and_keeps_the_output(project, corrupt):
    out = project / "data" / "annotate_text"
    before = tree_digest(out)
    corrupt(project / "data" / "rollout_text")
    # a lost dataset: "run rollout-text first (`curio stage rollout-text`)"; a damaged one: "rerun `curio stage ...`"
    assert_one_line(run(["stage", "annotate-text"]), "rollout_text", "`curio stage rollout-text`")
    assert tree_digest(out) == before


@pytest.mark.parametrize("corrupt", [corrupt_manifest_json, corrupt_manifest_bytes, corrupt_manifest_shape,
                                     corrupt_garbage, corrupt_delete_part],
                         ids=["json", "not-utf8", "shape", "garbage-part", "missing-part"])
def test_producer_repairs_its_own_output_by_recomputing(project, corrupt):
    out = project / "data" / "annotate_text"
    good = read_table(out).to_pylist()
    corrupt(out)
    assert run(["stage", "annotate-text"]).exit_code == 0
    assert read_table(out).to_pylist() == good


def test_a_run_with_new_params_keeps_the_old_output_until_it_is_complete(tmp_path):
    out = tmp_path / "ds"
    old = [{"x": i} for i in range(6)]
    run_chunked(out, num_chunks=3, make_chunk=lambda i: old[2 * i : 2 * i + 2], params_hash="old")
    before = tree_digest(out)

    def failing(i: int) -> list[dict]:
        if i == 2:
            raise OSError("disk went away")
        return [{"x": 100 + i}]

    with pytest.raises(OSError):
        run_chunked(out, num_chunks=3, make_chunk=failing, params_hash="new")
    assert tree_digest(out) == before and read_table(out).to_pylist() == old  # readers still see the old data
    calls = []
    run_chunked(out, num_chunks=3, make_chunk=lambda i: calls.append(i) or [{"x": 100 + i}], params_hash="new")
    assert calls == [2]  # the new run resumed beside the old output, then swapped in
    assert read_table(out).to_pylist() == [{"x": 100}, {"x": 101}, {"x": 102}]
    assert not (tmp_path / ".ds.next").exists() and not (tmp_path / ".ds.old").exists()


def test_an_interrupted_swap_is_finished_on_the_next_run(tmp_path):
    out = tmp_path / "ds"
    run_chunked(out, num_chunks=1, make_chunk=lambda i: [{"x": 1}], params_hash="old")
    ChunkedDataset(out, params_hash="new")  # starts the new run beside the old output
    run_chunked(tmp_path / ".ds.next", num_chunks=1, make_chunk=lambda i: [{"x": 2}], params_hash="new")
    os.replace(out, tmp_path / ".ds.old")  # killed between the two renames of the swap
    calls = []
    run_chunked(out, num_chunks=1, make_chunk=lambda i: calls.append(i) or [{"x": 3}], params_hash="new")
    assert calls == [] and read_table(out).to_pylist() == [{"x": 2}]


# -- models: a manifest of file hashes written at save time, checked before load ---------------------------------
def saved_model(root: Path) -> Path:
    model = root / "data" / "bootstrap" / "model"

    def write(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1}))
        (tmp / "model.safetensors").write_bytes(os.urandom(4096))
        (tmp / "tokenizer.json").write_text("{}")

    save_model_dir(model, write)
    return model


@pytest.mark.parametrize(("damage", "needle"), [
    (lambda m: (m / "model.safetensors").write_bytes((m / "model.safetensors").read_bytes()[:100]),
     "model.safetensors"),
    (lambda m: (m / "config.json").write_text("garbage"), "config.json"),
    (lambda m: (m / "tokenizer.json").unlink(), "tokenizer.json"),
    (lambda m: (m / MODEL_MANIFEST).write_bytes(b"\xff\x00"), "manifest"),
], ids=["truncated-weights", "garbage-config", "missing-file", "bad-manifest"])
def test_a_damaged_model_is_refused_before_loading(tmp_path, damage, needle):
    model = saved_model(tmp_path)
    verify_model(model)  # whole: passes
    damage(model)
    with pytest.raises(InputError, match=rf"{needle}.*rerun `curio stage bootstrap`"):
        verify_model(model)


@pytest.mark.slow  # imports transformers (~10-30 s on a loaded 2-core machine)
def test_load_policy_verifies_the_model_first(tmp_path):
    from pipeline.llm.hf import load_policy

    model = saved_model(tmp_path)
    (model / "config.json").write_text("garbage")
    with pytest.raises(InputError, match="config.json"):
        load_policy(model)


def test_saving_a_model_keeps_the_old_one_until_the_new_one_is_complete(tmp_path):
    model = saved_model(tmp_path)
    before = tree_digest(model)

    def crash(tmp: Path) -> None:
        (tmp / "model.safetensors").write_bytes(b"half")
        raise OSError("killed while saving")

    with pytest.raises(OSError):
        save_model_dir(model, crash)
    assert tree_digest(model) == before
    verify_model(model)


def test_a_damaged_reward_model_names_train_reward(tmp_path):
    import torch

    from pipeline.nethack.reward import (
        WEIGHTS,
        MessageRewardNet,
        RewardNetConfig,
        RewardStats,
        load_reward_model,
        save_reward_model,
    )

    torch.manual_seed(0)
    out = tmp_path / "data" / "train_reward"
    stats = RewardStats(mean=0.0, std=1.0, quantile_levels=[0.0, 1.0], quantile_values=[0.0, 1.0])
    save_reward_model(MessageRewardNet(RewardNetConfig()), stats, out)
    load_reward_model(out)
    (out / WEIGHTS).write_bytes((out / WEIGHTS).read_bytes()[:64])
    with pytest.raises(InputError, match=r"rerun `curio stage train-reward`"):
        load_reward_model(out)


# -- the response cache ---------------------------------------------------------------------------------------
class Scripted(ChatBackend):
    """Answers from a list per prompt (the last one repeats); counts what it was sent."""

    name = "scripted"

    def __init__(self, answers: dict[str, list[str]]) -> None:
        super().__init__("scripted-model")
        self.answers = answers
        self.sent: list[str] = []

    def generate(self, conversations, sampling: Sampling) -> list[Generation]:
        out = []
        for conv in conversations:
            prompt = conv[-1]["content"]
            nth = self.sent.count(prompt)
            self.sent.append(prompt)
            script = self.answers[prompt]
            text = script[min(nth, len(script) - 1)]
            out.append(Generation(text="", error="HTTP 500: boom") if text == "ERROR" else Generation(text=text))
        return out


def ask(backend: CachedBackend, prompts: list[str]) -> list[Generation]:
    return backend.generate([[{"role": "user", "content": p}] for p in prompts], Sampling(seed=0),
                            accept=lambda text: text.startswith("OK"))


def test_only_parseable_answers_are_cached_and_failures_are_reasked_a_bounded_number_of_times(tmp_path):
    inner = Scripted({"a": ["OK a"], "b": ["garbage"], "c": ["ERROR", "garbage", "OK c"]})
    cache = ResponseCache(tmp_path / "c.sqlite")
    for _ in range(5):  # five runs of the same stage
        backend = CachedBackend(inner, cache, max_attempts=3)
        out = ask(backend, ["a", "b", "c"])
    assert inner.sent.count("a") == 1  # an answer is asked once
    assert inner.sent.count("b") == 3  # garbage: asked max_attempts times, then served as the last failure
    assert inner.sent.count("c") == 3 and out[2].text == "OK c"  # a failure, then garbage, then an answer
    assert out[1].text == "garbage" and out[1].cached
    conn = sqlite3.connect(tmp_path / "c.sqlite")
    assert conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0] == 2  # a and c; never b
    assert conn.execute("SELECT attempts, text FROM failures").fetchall() == [(3, "garbage")]


def test_a_corrupt_cache_is_moved_aside_and_rebuilt(tmp_path, caplog):
    path = tmp_path / "llm-cache.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    cache = ResponseCache(path)
    backend = CachedBackend(Scripted({"a": ["OK a"]}), cache)
    assert ask(backend, ["a"])[0].text == "OK a" and len(cache) == 1
    aside = list(tmp_path.glob("llm-cache.sqlite.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not a database")
    warnings = [r for r in caplog.records if "moved to" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()


def test_annotate_text_stage_reasks_only_its_unknowns(project):
    """The judge path: a rerun sends requests only for the UNKNOWN verdicts, until max_attempts."""
    server = FakeServer()
    try:
        judge = ["-S", "annotate_text.judge.backend=openai", "-S", "annotate_text.judge.model=fake-model",
                 "-S", f"annotate_text.judge.base_url={server.base_url}"]
        server.configure(rules=CURIO_RULES, garbage_rate=0.3, seed=3)
        assert run(["stage", "annotate-text", *judge]).exit_code == 0
        first = read_table(project / "data" / "annotate_text").to_pylist()
        unknown = sum(r["judge_label"] == "UNKNOWN" for r in first)
        sent = server.stats()["requests"]
        assert unknown > 0 and sent == sum(r["success"] for r in first)
        assert run(["stage", "annotate-text", *judge]).exit_code == 0  # same server: a re-ask is a fresh draw
        second = read_table(project / "data" / "annotate_text").to_pylist()
        assert server.stats()["requests"] - sent == unknown  # only the UNKNOWN rows were asked again
        assert sum(r["judge_label"] == "UNKNOWN" for r in second) < unknown
        assert [r["judge_label"] for r in first if r["judge_label"] != "UNKNOWN"] == [
            s["judge_label"] for r, s in zip(first, second, strict=True) if r["judge_label"] != "UNKNOWN"]
    finally:
        server.close()


# -- a flaky server: 20 % 5xx, 10 % hangs, 10 % garbage ----------------------------------------------------------
FLAKY = {"error_rate": 0.2, "timeout_rate": 0.1, "garbage_rate": 0.1, "hang_s": 1.0, "rules": CURIO_RULES,
         "record": True, "seed": 11}


def llm_role(prefix: str, server: FakeServer) -> list[str]:
    values = {"backend": "openai", "model": "fake-model", "base_url": server.base_url, "timeout_s": 0.4,
              "max_retries": 2, "backoff_s": 0.01, "max_concurrency": 8}
    return [arg for k, v in values.items() for arg in ("-S", f"{prefix}.{k}={v}")]


def flaky_runs(server: FakeServer, stage: str, args: list[str], out: Path, label: str, owner) -> list[dict]:
    """The first run and two reruns against the same flaky server, then one more that must send nothing.

    ``owner(request_text, rows)`` → the rows a request may have been sent for. Returns per-run figures.
    """
    figures, seen = [], 0
    previous_unknown: set[int] | None = None
    for attempt in range(4):
        result = run(["stage", stage, *args])
        assert result.exit_code == 0, result.stderr
        rows = read_table(out).to_pylist()
        log = server.stats()["log"][seen:]
        seen += len(log)
        owners = [owner(text, rows) for text, _ in log]
        if previous_unknown is not None:  # a rerun asks only for the rows still UNKNOWN
            assert all(o & previous_unknown for o in owners)
        unknown = {i for i, r in enumerate(rows) if r[label] == "UNKNOWN"}
        outcomes: dict[str, int] = {}
        for _, outcome in log:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        asked = set().union(*owners) & (previous_unknown if previous_unknown is not None else set(range(len(rows))))
        figures.append({"run": attempt, "requests": len(log), "rows_asked": len(asked), "unknown": len(unknown),
                        **outcomes})
        previous_unknown = unknown
    assert figures[-1]["requests"] == 0  # after the first run and two reruns every request hit max_attempts
    return figures


def assert_unknown_only_where_garbage_persisted(server: FakeServer, rows: list[dict], label: str, raw: str,
                                                owner) -> None:
    """Every row still UNKNOWN got max_attempts answers for its request(s), none of them parseable."""
    per_row: dict[int, list[str]] = {}
    for text, outcome in server.stats()["log"]:
        for i in owner(text, rows):
            per_row.setdefault(i, []).append(outcome)
    for i, r in enumerate(rows):
        if r[label] == "UNKNOWN":
            assert "[request failed]" not in r[raw]  # a transport failure would have been re-asked
            assert sum(o != "error" for o in per_row[i]) >= 3  # answered (garbage) on every attempt


def test_flaky_server_annotate_text_ends_with_unknown_only_for_persistent_garbage(project):
    write_dataset(project / "data" / "rollout_text", rollout_rows(64), ROLLOUT_SCHEMA)  # 48 claimed wins
    server = FakeServer()
    try:
        server.configure(**FLAKY)

        def owner(text: str, rows: list[dict]) -> set[int]:
            return {int(text.split("(game ")[1].split(")")[0])}

        out = project / "data" / "annotate_text"
        figures = flaky_runs(server, "annotate-text", llm_role("annotate_text.judge", server), out, "judge_label",
                             owner)
        rows = read_table(out).to_pylist()
        assert_unknown_only_where_garbage_persisted(server, rows, "judge_label", "judge_raw", owner)
        assert figures[0]["unknown"] > figures[2]["unknown"]  # reruns recovered failures and one-off garbage
        print("annotate-text flaky-server figures:", figures)
    finally:
        server.close()


def test_flaky_server_annotate_nethack_ends_with_unknown_only_for_persistent_garbage(project):
    messages = [f"You see here {i} gold pieces." if i % 3 else f"You kill the newt number {i}!" for i in range(40)]
    write_dataset(project / "data" / "rollout_nethack",
                  [{"episode": i // 10, "step": i % 10, "message": m} for i, m in enumerate(messages)])
    server = FakeServer()
    try:
        server.configure(**FLAKY)

        def owner(text: str, rows: list[dict]) -> set[int]:  # identical pairs share their requests
            return {i for i, r in enumerate(rows) if r["caption_first"] in text and r["caption_second"] in text}

        args = [*llm_role("annotate_nethack.annotator", server), "-S", "annotate_nethack.num_pairs=48",
                "-S", "annotate_nethack.pairs_per_chunk=16"]
        out = project / "data" / "annotate_nethack"
        figures = flaky_runs(server, "annotate-nethack", args, out, "label", owner)
        rows = read_table(out).to_pylist()
        assert_unknown_only_where_garbage_persisted(server, rows, "label", "raw", owner)
        assert figures[0]["unknown"] > figures[2]["unknown"]
        print("annotate-nethack flaky-server figures:", figures)
    finally:
        server.close()


def test_a_producer_reading_its_own_parts_mid_run_sees_the_new_ones(tmp_path):
    """rollout-text's curriculum reads the rounds it already wrote while the old output is still in place."""
    from pipeline.core.artifacts import read_part

    out = tmp_path / "ds"
    run_chunked(out, num_chunks=2, make_chunk=lambda i: [{"x": i}], params_hash="old")
    seen = []
    run_chunked(out, num_chunks=2, make_chunk=lambda i: [{"x": 10 + i}], params_hash="new",
                on_chunk=lambda i: seen.append(read_part(out, i)))
    assert seen == [[{"x": 10}], [{"x": 11}]] and read_table(out).to_pylist() == [{"x": 10}, {"x": 11}]
