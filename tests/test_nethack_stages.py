"""The NetHack track's stages on a tiny budget: outputs, determinism, and resume in rollout, annotate and rl."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import NETHACK_TINY as TINY
from conftest import nethack_params as make_params

from pipeline.core.artifacts import read_manifest, read_table
from pipeline.core.stage import StageContext, execute
from pipeline.llm.base import ChatBackend, Generation, Sampling
from pipeline.params import Params, load_params


class FakeJudge(ChatBackend):
    """Answers like a Motif annotator, deterministically from the prompt; can fail or ramble on purpose."""

    name = "fake"

    def __init__(self, fail_on_call: int | None = None, ramble_on: str | None = None) -> None:
        super().__init__("fake-judge")
        self.calls = 0
        self.conversations = 0
        self.fail_on_call = fail_on_call
        self.ramble_on = ramble_on

    def generate(self, conversations, sampling: Sampling) -> list[Generation]:
        self.calls += 1
        if self.fail_on_call is not None and self.calls == self.fail_on_call:
            raise RuntimeError("server went away")
        self.conversations += len(conversations)
        out = []
        for conv in conversations:
            prompt = conv[1]["content"] if len(conv) > 1 else conv[0]["content"]
            if self.ramble_on and self.ramble_on in prompt:
                out.append(Generation("Both are interesting in their own way."))
                continue
            choice = 1 + hashlib.sha256(prompt.encode()).digest()[0] % 2
            out.append(Generation(f'Compared. ("best_description": {choice})'))
        return out


def run_annotate(params: Params, backend: ChatBackend):
    from stages import annotate_nethack

    return annotate_nethack.run(params, StageContext(), backend=backend)


def test_rollout_rows_and_resume_after_a_crash(tmp_path, monkeypatch):
    from stages import rollout_nethack

    whole = make_params(tmp_path / "whole")
    execute("rollout-nethack", whole)
    table = read_table(whole.data_path("rollout_nethack"))
    assert table.num_rows > 4 and set(table["episode"].to_pylist()) == {0, 1, 2, 3}
    first = table.slice(0, 1).to_pylist()[0]
    assert first["step"] == 0 and first["action"] == -1 and first["message"].startswith("Hello Agent, welcome")
    assert len(first["blstats"]) == 27
    assert sum(table["done"].to_pylist()) == 4

    crashed = make_params(tmp_path / "crashed")
    real, calls = rollout_nethack.collect_chunk, []

    def flaky(params, index, policy=None):
        calls.append(index)
        if index == 1 and len(calls) == 2:
            raise KeyboardInterrupt  # killed while playing the second chunk
        return real(params, index, policy)

    monkeypatch.setattr(rollout_nethack, "collect_chunk", flaky)
    with pytest.raises(KeyboardInterrupt):
        execute("rollout-nethack", crashed)
    execute("rollout-nethack", crashed)
    assert calls == [0, 1, 1]  # the finished chunk was kept, not replayed
    assert read_table(crashed.data_path("rollout_nethack")).equals(table)


def test_evaluate_keeps_replays_of_its_first_episodes_and_resumes(tmp_path, monkeypatch):
    """evaluate-nethack records every step (and terminal frame) of each policy's first replay_episodes episodes, as
    rollout-nethack records its steps, beside the per-episode summaries; a run killed between the two parts of a
    chunk resumes to the same tables."""
    from pipeline.core.artifacts import ChunkedDataset
    from pipeline.nethack.play import REPLAY_STEP_SCHEMA, TTY_SIZE

    args = ["evaluate_nethack.policies=[random]", "evaluate_nethack.episodes=3", "evaluate_nethack.replay_episodes=2",
            "evaluate_nethack.max_episode_steps=60"]
    whole = make_params(tmp_path / "whole", *args)
    metrics = execute("evaluate-nethack", whole).metrics
    episodes = read_table(whole.data_path("evaluate_nethack"))
    steps = read_table(whole.data_path("evaluate_nethack_replays"))
    assert steps.schema == REPLAY_STEP_SCHEMA and metrics["replay_steps"] == steps.num_rows
    rows = steps.to_pylist()
    assert {r["episode"] for r in rows} == {0, 1} and {r["policy"] for r in rows} == {"random"}
    for e in episodes.to_pylist()[:2]:  # each replay is its whole episode: step 0 (the reset) to the last step
        mine = [r for r in rows if r["episode"] == e["episode"]]
        assert [r["step"] for r in mine] == list(range(e["length"] + 1)) and mine[-1]["done"]
        assert sum(r["reward"] for r in mine) == pytest.approx(e["return"])
    assert all(len(r["tty_chars"]) == TTY_SIZE for r in rows)
    assert rows[0]["tty_chars"][:80].decode("latin-1").strip() == rows[0]["message"].strip()[:80]
    no_replays = make_params(tmp_path / "none", *args, "evaluate_nethack.replay_episodes=0")
    execute("evaluate-nethack", no_replays)
    assert read_table(no_replays.data_path("evaluate_nethack")).equals(episodes)  # recording changes no outcome
    assert read_table(no_replays.data_path("evaluate_nethack_replays")).num_rows == 0

    crashed = make_params(tmp_path / "crashed", *args)
    real = ChunkedDataset.write_part

    def killed_after_the_replays(self, index, rows, schema=None):
        if self.final.name == "evaluate_nethack":
            raise KeyboardInterrupt
        return real(self, index, rows, schema)

    monkeypatch.setattr(ChunkedDataset, "write_part", killed_after_the_replays)
    with pytest.raises(KeyboardInterrupt):
        execute("evaluate-nethack", crashed)
    assert len(read_manifest(crashed.data_path("evaluate_nethack_replays"))["parts"]) == 1
    monkeypatch.setattr(ChunkedDataset, "write_part", real)
    execute("evaluate-nethack", crashed)
    assert read_table(crashed.data_path("evaluate_nethack")).equals(episodes)
    assert read_table(crashed.data_path("evaluate_nethack_replays")).equals(steps)


def test_embedding_annotator_is_the_default(chain):
    rows = read_table(chain.data_path("annotate_nethack")).to_pylist()
    assert len(rows) == 600
    labels = {r["label"] for r in rows}
    assert labels <= {"FIRST", "SECOND", "TIE"} and {"FIRST", "SECOND"} <= labels
    for r in rows:
        if r["caption_first"] == r["caption_second"]:
            assert (r["label"], r["raw"]) == ("TIE", "")  # no call for identical captions
        else:
            assert r["raw"].startswith("similarity")
        assert (r["attempts"], r["cached"], r["tokens_in"], r["tokens_out"]) == (0, None, 0, 0)  # no LLM request
    metrics = json.loads((chain.metrics_path("stages") / "annotate-nethack.json").read_text())
    assert metrics["labels/unknown"] == 0 and metrics["pairs"] == 600


def test_annotate_resumes_after_a_crash_with_the_same_rows(chain, tmp_path):
    whole = chain.model_copy(update={"data_dir": str(tmp_path / "whole")})
    crashed = chain.model_copy(update={"data_dir": str(tmp_path / "crashed")})
    for p in (whole, crashed):  # share the rollouts
        Path(p.data_dir).mkdir()
        (Path(p.data_dir) / "rollout_nethack").symlink_to(chain.data_path("rollout_nethack"))
    judge = FakeJudge()
    run_annotate(whole, judge)
    expected = read_table(whole.data_path("annotate_nethack"))

    with pytest.raises(RuntimeError, match="server went away"):
        run_annotate(crashed, FakeJudge(fail_on_call=2))  # dies on the second chunk
    assert len(read_manifest(crashed.data_path("annotate_nethack"))["parts"]) == 1
    resumed = FakeJudge()
    run_annotate(crashed, resumed)
    assert read_table(crashed.data_path("annotate_nethack")).equals(expected)
    assert resumed.conversations < judge.conversations  # the finished chunk was not asked again


def test_annotate_rerun_asks_only_the_unknown_rows(chain, tmp_path):
    params = chain.model_copy(update={"data_dir": str(tmp_path / "d")})
    Path(params.data_dir).mkdir()
    (Path(params.data_dir) / "rollout_nethack").symlink_to(chain.data_path("rollout_nethack"))
    out = params.data_path("annotate_nethack")
    first = run_annotate(params, FakeJudge(ramble_on="It's a wall."))
    before = read_table(out).to_pylist()
    unknown = [r for r in before if r["label"] == "UNKNOWN"]
    assert unknown and first.metrics["labels/unknown"] == len(unknown)
    assert all("[retry]" in r["raw"] and r["attempts"] == 2 for r in unknown)  # one retry turn was tried
    assert {r["attempts"] for r in before if r["label"] != "UNKNOWN"} <= {0, 1, 2}

    judge = FakeJudge()
    second = run_annotate(params, judge)
    after = read_table(out).to_pylist()
    assert judge.conversations == len(unknown) and second.metrics["unknown_redone"] == len(unknown)
    assert second.metrics["labels/unknown"] == 0
    for b, a in zip(before, after, strict=True):
        assert a["pair"] == b["pair"]
        if b["label"] != "UNKNOWN":
            assert a == b  # answered rows untouched
        else:
            assert a["attempts"] >= 1 and a["cached"] is False  # what the rerun paid for it


class FakeLabeller(ChatBackend):
    """ONI-style labeller: 'helpful' when the message mentions killing or gold, 'unhelpful' otherwise."""

    name = "fake-labeller"

    def __init__(self) -> None:
        super().__init__("fake-labeller")
        self.batches: list[list[str]] = []

    def generate(self, conversations, sampling: Sampling) -> list[Generation]:
        out = []
        self.batches.append([])
        for conv in conversations:
            message = conv[-1]["content"].split('"')[1]
            self.batches[-1].append(message)
            helpful = any(w in message.lower() for w in ("kill", "gold", "welcome"))
            out.append(Generation(f"Thinking.\n<label>{'helpful' if helpful else 'unhelpful'}</label>"))
        return out


def test_oni_labels_mode_labels_each_caption_once_and_derives_pair_preferences(chain, tmp_path):
    params = chain.model_copy(deep=True, update={"data_dir": str(tmp_path / "d")})
    params.annotate_nethack.mode = "labels"
    Path(params.data_dir).mkdir()
    (Path(params.data_dir) / "rollout_nethack").symlink_to(chain.data_path("rollout_nethack"))
    labeller = FakeLabeller()
    run_annotate(params, labeller)
    rows = read_table(params.data_path("annotate_nethack")).to_pylist()
    assert len(labeller.batches) == 3  # one request batch per chunk
    for batch in labeller.batches:
        assert len(batch) == len(set(batch))  # each distinct caption asked once, not once per pair
        assert "" not in batch  # empty captions are unhelpful without a call
    for r in rows:
        answers = json.loads(r["raw"])
        first, second = answers["first"][0], answers["second"][0]
        expected = "TIE" if first == second else ("FIRST" if first == "helpful" else "SECOND")
        assert r["label"] == expected
    assert {r["label"] for r in rows} >= {"TIE", "FIRST", "SECOND"}
    # each caption's request is billed to the first pair of its chunk that shows it: the rows sum to the requests
    assert sum(r["attempts"] for r in rows) == sum(len(b) for b in labeller.batches)
    assert any(r["cached"] for r in rows) and any(r["cached"] is False for r in rows)


def test_pairs_drop_unknown_and_keep_ties_as_half(tmp_path):
    import pyarrow as pa

    from stages.pairs_nethack import build

    annotations = pa.table({
        "pair": list(range(6)),
        "caption_first": ["a", "b", "c", "d", "e", "f"],
        "caption_second": ["x", "y", "z", "w", "v", "u"],
        "label": ["FIRST", "SECOND", "TIE", "UNKNOWN", "TIE", "FIRST"],
    })
    rows = build(annotations, seed=0, val_fraction=0.5, keep_ties=True).to_pylist()
    assert [(r["pair"], r["y"]) for r in rows] == [(0, 0.0), (1, 1.0), (2, 0.5), (4, 0.5), (5, 0.0)]
    assert {r["split"] for r in rows} <= {"train", "val"}
    again = build(annotations, seed=0, val_fraction=0.5, keep_ties=True).to_pylist()
    assert [r["split"] for r in again] == [r["split"] for r in rows]
    no_ties = build(annotations, seed=0, val_fraction=0.5, keep_ties=False).to_pylist()
    assert [r["pair"] for r in no_ties] == [0, 1, 5]


def test_reward_model_agrees_with_the_annotator_on_held_out_pairs(chain):
    metrics = json.loads((chain.metrics_path("stages") / "train-reward.json").read_text())
    assert metrics["val_pairs"] > 50
    assert metrics["val_agreement"] >= 0.8  # tiny data here; the default pipeline reports ~0.99
    out = chain.data_path("reward_model")
    stats = json.loads((out / "stats.json").read_text())
    assert stats["quantile_values"] == sorted(stats["quantile_values"]) and len(stats["quantile_levels"]) == 101
    table = json.loads((out / "message_rewards.json").read_text())
    pairs = read_table(chain.data_path("pairs_nethack"))
    assert set(table) == set(pairs["caption_first"].to_pylist()) | set(pairs["caption_second"].to_pylist())
    assert (chain.plots_path() / "train-reward.csv").exists()


def test_rl_resumes_from_its_checkpoint_skips_when_done_and_restarts_on_new_rewards(chain):
    from stages.rl_nethack import train_variant

    variant = chain.rl_nethack.variants["motif"]
    first = train_variant(chain, "motif", variant)
    assert first["action"] == "trained" and first["env_steps"] >= 1024 and first["resumed_from_env_steps"] == 0

    longer = chain.model_copy(deep=True)
    longer.rl_nethack.train_for_env_steps = 2048
    second = train_variant(longer, "motif", variant)
    assert second["action"] == "resumed"
    assert second["resumed_from_env_steps"] >= first["env_steps"]  # continued, not restarted
    assert second["env_steps"] >= 2048
    assert second["env_steps_this_run"] < second["env_steps"]

    assert train_variant(longer, "motif", variant)["action"].startswith("skipped")

    experiment = chain.data_path("rl_nethack", "motif")
    config = json.loads((experiment / "config.json").read_text())
    assert (config["int_coef"], config["threshold_quantile"], config["count_exponent"]) == (0.1, 0.5, 3.0)

    # Evaluate the trained agent next to a random one (same seeds); then check the stage's outputs.
    execute("evaluate-nethack", longer)
    metrics = json.loads((chain.metrics_path("stages") / "evaluate-nethack.json").read_text())
    for policy in ("random", "motif"):
        assert metrics[f"{policy}/episodes"] == 2
        assert metrics[f"{policy}/length"] <= 150
        assert metrics[f"{policy}/depth"] >= 1
    assert (chain.plots_path() / "evaluate-nethack.png").stat().st_size > 1000
    episodes = pq.read_table(chain.data_path("evaluate_nethack", "part-00000.parquet")).to_pylist()
    assert [e["policy"] for e in episodes] == ["random", "random"]
    # evaluated on unseen games: no evaluation seed is one of the games the agent began in training
    from pipeline.nethack.env import nethack_core_seed
    from pipeline.nethack.sf import training_seed_cores

    trained = training_seed_cores(experiment)
    envs = chain.rl_nethack.num_workers * chain.rl_nethack.num_envs_per_worker
    assert trained and metrics["training_games_checked"] == len(trained) >= envs  # each env began a game at least
    evaluated = {nethack_core_seed(e["seed"]) for e in read_table(chain.data_path("evaluate_nethack")).to_pylist()}
    assert len(evaluated) == 2 and not evaluated & trained

    # The trained agent can also collect rollouts (Motif's dataset came from agents trained on the score).
    from_agent = longer.model_copy(deep=True, update={"data_dir": str(chain.data_path("from_agent"))})
    from_agent.rollout_nethack = from_agent.rollout_nethack.model_copy(
        update={"policy": "checkpoint", "checkpoint": str(experiment), "max_episode_steps": 60}
    )
    execute("rollout-nethack", from_agent)
    steps = read_table(from_agent.data_path("rollout_nethack"))
    assert set(steps["episode"].to_pylist()) == {0, 1, 2, 3} and max(steps["step"].to_pylist()) <= 60

    # Other reward coefficients: the old checkpoints must not be continued.
    changed = variant.model_copy(update={"int_coef": 0.2})
    third = train_variant(longer, "motif", changed)
    assert third["action"] == "trained" and third["resumed_from_env_steps"] == 0


def test_a_variant_past_its_timeout_is_one_line_and_keeps_its_checkpoint(chain, tmp_path):
    """rl_nethack.timeout_s: the trainer is stopped (it saves), and the stage says how to resume, exit 4."""
    from conftest import nethack_params

    from pipeline.core.errors import TimedOut
    from pipeline.nethack.sf import latest_checkpoint
    from stages.rl_nethack import train_variant

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "reward_model").symlink_to(chain.data_path("reward_model"))
    params = nethack_params(tmp_path, "rl_nethack.timeout_s=10", "rl_nethack.train_for_env_steps=50000000")
    with pytest.raises(TimedOut) as info:
        train_variant(params, "motif", params.rl_nethack.variants["motif"])
    assert info.value.exit_code == 4 and "\n" not in str(info.value)
    assert "did not finish within rl_nethack.timeout_s = 10 s" in str(info.value) and "dvc repro" in str(info.value)
    assert latest_checkpoint(tmp_path / "data" / "rl_nethack" / "motif") is not None  # saved on the way out


def test_rl_stage_killed_mid_training_stops_its_trainer_and_resumes(chain, tmp_path):
    import subprocess
    import sys
    import time

    import psutil

    from pipeline.nethack.sf import latest_checkpoint
    from stages.rl_nethack import train_variant

    project = tmp_path / "proj"
    (project / "data").mkdir(parents=True)
    (project / "data" / "reward_model").symlink_to(chain.data_path("reward_model"))
    overrides = [*TINY, "rl_nethack.train_for_env_steps=500000", "rl_nethack.extra_args=['--save_every_sec=2']"]
    import yaml

    from pipeline.core.config import _set_dotted, parse_override

    raw: dict = {}
    for o in overrides:
        _set_dotted(raw, *parse_override(o))
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    stage = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "stage", "rl-nethack"], cwd=project,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    experiment = project / "data" / "rl_nethack" / "motif"
    deadline = time.time() + 180
    while (latest_checkpoint(experiment) or (None, 0))[1] == 0 and time.time() < deadline:
        time.sleep(0.5)  # the first checkpoint (step 0) is written at start; wait for one with progress
    _, steps_seen = latest_checkpoint(experiment) or (None, 0)
    assert steps_seen > 0, "no checkpoint written in time"
    trainers = psutil.Process(stage.pid).children(recursive=True)
    assert trainers
    stage.kill()  # SIGKILL: the stage gets no chance to clean up
    stage.wait()
    _, alive = psutil.wait_procs(trainers, timeout=60)
    assert not alive  # the trainer went down with its stage (and saved on the way)
    _, steps_at_kill = latest_checkpoint(experiment)
    assert steps_seen <= steps_at_kill < 500000

    params = load_params(project / "params.yaml", [f"data_dir={project / 'data'}",
                                                   f"rl_nethack.train_for_env_steps={steps_at_kill + 1024}"])
    resumed = train_variant(params, "motif", params.rl_nethack.variants["motif"])
    assert resumed["action"] == "resumed" and resumed["resumed_from_env_steps"] == steps_at_kill
    assert resumed["env_steps"] >= steps_at_kill + 1024


def test_evaluate_summary_pairs_each_policy_with_random_seed_by_seed():
    """The paired difference from random, by hand: seeds 1-3, random returns 1, 2, 3 and motif 2, 2, 7 → differences
    1, 0, 4: mean 5/3, s.d. √((4/9 + 25/9 + 49/9)/2) = √(13/3), s.e. √(13/3)/√3 = √13/3. A policy
    without random in the run has no paired columns; an unmatched seed is left out of the pairing."""
    import math

    from stages.evaluate_nethack import summarize

    def row(policy, seed, ret):
        return {"policy": policy, "seed": seed, "return": ret, "score": 10 * ret, "depth": 1, "xlvl": 1, "length": 5,
                "success": 0}

    rows = [row("random", s, r) for s, r in ((1, 1.0), (2, 2.0), (3, 3.0))]
    rows += [row("motif", s, r) for s, r in ((1, 2.0), (2, 2.0), (3, 7.0), (9, 100.0))]
    summary = summarize(rows, ["random", "motif"])
    motif = summary["motif"]
    assert motif["return_vs_random"] == pytest.approx(5 / 3)
    assert motif["return_vs_random_sem"] == pytest.approx(math.sqrt(13) / 3)
    assert motif["score_vs_random"] == pytest.approx(50 / 3)
    assert motif["return"] == pytest.approx(111 / 4)  # the unpaired mean keeps every episode
    assert "return_vs_random" not in summary["random"]
    assert "return_vs_random" not in summarize(rows, ["motif"])["motif"]
    assert motif["score_median"] == pytest.approx(45.0) and summary["random"]["score_median"] == 20.0
    # the extrinsic agent is the other baseline, paired the same way: extrinsic returns 1, 1, 1 -> 1, 1, 6
    rows += [row("extrinsic", s, 1.0) for s in (1, 2, 3)]
    paired = summarize(rows, ["random", "extrinsic", "motif"])["motif"]
    assert paired["return_vs_extrinsic"] == pytest.approx(8 / 3) and "return_vs_random" in paired
    # and Motif the third, for ONI's claim: an online agent returning 2, 2, 2 -> differences 0, 0, -5
    rows += [row("oni_ranking", s, 2.0) for s in (1, 2, 3)]
    oni = summarize(rows, ["random", "extrinsic", "motif", "oni_ranking"])["oni_ranking"]
    assert oni["return_vs_motif"] == pytest.approx(-5 / 3) and oni["return_vs_motif_sem"] == pytest.approx(5 / 3)


def test_balrog_progression_by_hand():
    """BALROG's table (pipeline/nethack/data/balrog_progression.json): dungeon level 1 at experience level 1 is 0;
    otherwise 100 x the larger of the two levels' human win shares (dungeon level 2: 0.015392, experience level 2:
    0.018478, experience level 10: 0.1791); levels past the table count as its last."""
    from pipeline.nethack.progression import progression
    from stages.evaluate_nethack import summarize

    assert progression(1, 1) == 0.0
    assert progression(2, 1) == pytest.approx(1.5392)
    assert progression(2, 2) == pytest.approx(1.8478)
    assert progression(1, 10) == pytest.approx(17.91, abs=1e-2)
    assert progression(60, 1) == progression(50, 1) > 80.0
    rows = [{"policy": "a", "seed": s, "return": 0.0, "score": 0, "depth": d, "xlvl": x, "length": 1, "success": 0}
            for s, (d, x) in enumerate(((1, 1), (2, 1), (2, 2)))]
    assert summarize(rows, ["a"])["a"]["progression"] == pytest.approx((0 + 1.5392 + 1.8478) / 3)


def test_every_metric_the_nethack_stages_write_is_declared(chain):
    """The metrics files of the session's NetHack chain, rl-nethack's (the motif variant the test above trained
    further is skipped, so the stage only reports) and evaluate-nethack's when the test above ran: each key is one its
    stage declares (docs/metrics.md)."""
    from pipeline.core.stage import declaration, undeclared_metrics

    execute("rl-nethack", chain)
    written = {p.stem: json.loads(p.read_text()) for p in chain.metrics_path("stages").glob("*.json")}
    assert {"rollout-nethack", "annotate-nethack", "pairs-nethack", "train-reward", "rl-nethack"} <= set(written)
    assert "motif/env_steps" in written["rl-nethack"]
    for name, metrics in written.items():
        assert undeclared_metrics(declaration(name), list(metrics)) == [], name
