"""ONI's online intrinsic rewards: each reward type against hand-computed values, the worker's table and spool,
the annotator's queue, labels, online training, failures and resume."""

from __future__ import annotations

import json
import math
import os
import re
import time

import numpy as np
import pytest

from pipeline.llm.base import ChatBackend, Generation, Sampling
from pipeline.nethack import oni
from pipeline.nethack.intrinsic import EpisodicIntrinsicReward
from pipeline.nethack.oni import (
    OnlineAnnotator,
    OnlineRewards,
    classification_rewards,
    cosine_rewards,
    ranking_rewards,
    retrieval_rewards,
    updates_for_batch,
)


# -- reward types by hand -------------------------------------------------------------------------------------
def test_retrieval_is_a_lookup_of_labels_and_zero_until_labelled():
    table = retrieval_rewards({"You find gold.": "helpful", "It's a wall.": "unhelpful", "???": "UNKNOWN"})
    assert table == {"You find gold.": 1.0, "It's a wall.": 0.0}  # UNKNOWN is absent: worth 0 like unlabelled
    worker = OnlineRewards("/nonexistent")
    worker.table = table
    assert worker("You find gold.") == 1.0 and worker("It's a wall.") == 0.0 and worker("never labelled") == 0.0


def test_classification_reward_is_one_only_strictly_above_one_half():
    assert classification_rewards(np.array([0.2, 0.5, 0.5001, 0.9])).tolist() == [0.0, 0.0, 1.0, 1.0]


def test_ranking_reward_is_standardised_then_thresholded_at_the_quantile():
    # scores 1..4: mean 2.5, std sqrt(1.25); z = ±0.4472, ±1.3416; the median of z is 0
    r = ranking_rewards(np.array([1.0, 2.0, 3.0, 4.0]), quantile=0.5)
    s = math.sqrt(1.25)
    assert r == pytest.approx([0.0, 0.0, 0.5 / s, 1.5 / s])
    # ε at the 0.75 quantile of z (= 0.8944 by linear interpolation): only the top message keeps its z
    assert ranking_rewards(np.array([1.0, 2.0, 3.0, 4.0]), quantile=0.75) == pytest.approx([0, 0, 0, 1.5 / s])


def test_cosine_reward_keeps_the_cosine_only_above_the_threshold():
    assert cosine_rewards(np.array([0.1, 0.2, 0.35]), 0.2).tolist() == [0.0, 0.0, 0.35]


def test_model_updates_are_many_after_the_first_batch_and_fewer_later():
    assert [updates_for_batch(k, 200, 10) for k in (1, 2, 4, 20, 100)] == [200, 100, 50, 10, 10]


def test_count_exponent_applies_to_online_rewards_and_restarts_each_episode():
    worker = OnlineRewards("/nonexistent")
    worker.table = {"You kill the newt!": 1.0}
    reward = EpisodicIntrinsicReward(worker, ext_coef=0.1, int_coef=0.4, count_exponent=3.0)
    got = [reward.step("You kill the newt!", 1.0) for _ in range(3)]
    # r = 0.1·1 + 0.4·1/n³ for n = 1, 2, 3
    assert [t for t, _ in got] == pytest.approx([0.1 + 0.4, 0.1 + 0.4 / 8, 0.1 + 0.4 / 27])
    reward.reset()
    assert reward.step("You kill the newt!", 0.0) == pytest.approx((0.4, 1.0))


# -- the worker side ------------------------------------------------------------------------------------------
def test_worker_spools_each_new_message_once_and_picks_up_published_tables(tmp_path):
    worker = OnlineRewards(tmp_path, refresh_s=0.0)
    for m in ["a", "b", "a", "", "c", "b"]:
        assert worker(m) == 0.0  # nothing published yet: nothing waits, everything is worth 0
    lines = [json.loads(x) for f in (tmp_path / oni.SEEN).glob("*.jsonl") for x in f.read_text().splitlines()]
    assert lines == ["a", "b", "c"]  # empty messages are not labelled
    (tmp_path / oni.TABLE).write_text(json.dumps({"version": 1, "rewards": {"b": 0.7}}))
    assert worker("b") == 0.7 and worker("a") == 0.0 and worker.version == 1


# -- the annotator --------------------------------------------------------------------------------------------
class Labeller(ChatBackend):
    """helpful iff the message mentions gold; 'babble' gets an unparseable answer; can be down."""

    name = "fake"

    def __init__(self) -> None:
        super().__init__("fake-labeller")
        self.asked: list[str] = []
        self.down = False

    def generate(self, conversations, sampling: Sampling) -> list[Generation]:
        out = []
        for conv in conversations:
            message = re.search(r'message:\n"(.*)"\n', conv[-1]["content"]).group(1)
            if self.down:
                out.append(Generation("", error="connection refused"))
                continue
            self.asked.append(message)
            if "babble" in message:
                out.append(Generation("I cannot decide."))
            else:
                out.append(Generation(f"<label>{'helpful' if 'gold' in message else 'unhelpful'}</label>"))
        return out


class Features:
    """A stand-in embedder: [mentions gold, mentions wall, 1], and a given similarity per message."""

    def __init__(self, similarity: dict[str, float] | None = None) -> None:
        self.sim = similarity or {}

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.array([[float("gold" in t), float("wall" in t), 1.0] for t in texts], dtype=np.float32)

    def similarity(self, texts: list[str], goal: str) -> np.ndarray:
        return np.array([self.sim[t] for t in texts])


def spool(directory, messages: list[str]) -> None:
    (directory / oni.SEEN).mkdir(parents=True, exist_ok=True)
    with open(directory / oni.SEEN / "1.jsonl", "a") as f:
        f.write("".join(json.dumps(m) + "\n" for m in messages))


def table(directory) -> dict[str, float]:
    return json.loads((directory / oni.TABLE).read_text())["rewards"]


def test_retrieval_annotator_labels_in_batches_and_publishes_the_labels(tmp_path):
    messages = ["You find 5 gold pieces.", "It's a wall.", "You find 5 gold pieces.", "A gold ring."]
    # publish_s 0: a step labels one batch, then publishes
    one = tmp_path / "one"
    backend = Labeller()
    ann = OnlineAnnotator(one, {"reward": "retrieval", "batch_size": 2, "publish_s": 0}, backend=backend)
    spool(one, messages)
    assert ann.step()
    assert ann.status()["pending"] == 1 and ann.status()["labels"] == 2  # dedup: 3 distinct messages, batch 2
    assert table(one) == {"You find 5 gold pieces.": 1.0}
    ann.step()
    assert table(one) == {"You find 5 gold pieces.": 1.0, "A gold ring.": 1.0}
    assert ann.status()["helpful_share"] == round(2 / 3, 4) and ann.status()["pending"] == 0
    assert len(backend.asked) == 3  # each distinct message asked once

    # by default a step labels the queue batch after batch (within publish_s) and publishes once
    backend = Labeller()
    ann = OnlineAnnotator(tmp_path, {"reward": "retrieval", "batch_size": 2}, backend=backend)
    spool(tmp_path, messages)
    assert ann.step()
    assert ann.status()["pending"] == 0 and ann.status()["labels"] == 3 and ann.status()["batches"] == 2
    assert [json.loads(line)["batch"] for line in (tmp_path / oni.LABELS).read_text().splitlines()] == [1, 1, 2]
    assert table(tmp_path) == {"You find 5 gold pieces.": 1.0, "A gold ring.": 1.0}
    assert len(backend.asked) == 3


def test_unparseable_answers_are_asked_again_then_given_up_and_a_dead_server_only_delays(tmp_path):
    backend = Labeller()
    ann = OnlineAnnotator(tmp_path, {"reward": "retrieval", "batch_size": 8, "max_attempts": 2,
                                     "poll_s": 0.0}, backend=backend)
    spool(tmp_path, ["babble", "gold!"])
    backend.down = True
    with pytest.raises(RuntimeError, match="failed"):
        ann.step()  # run() logs this and retries later
    assert ann.status()["pending"] == 2  # a request that never got an answer is not an attempt
    backend.down = False
    ann.step()
    assert ann.status()["pending"] == 1  # 'babble' answered garbage once: asked again
    ann.step()
    assert ann.status()["pending"] == 0 and ann.status()["given_up"] == 1
    assert table(tmp_path) == {"gold!": 1.0}

    rounds = iter(range(6))
    backend.down = True
    spool(tmp_path, ["more gold"])
    ann.run(should_stop=lambda: next(rounds) >= 5)  # never raises while the server is down
    assert ann.errors > 0 and ann.status()["pending"] == 1


def test_classification_learns_from_labels_online_and_reports_held_back_accuracy(tmp_path):
    messages = [f"{w} {i}" for i in range(40) for w in ("gold", "wall")]
    ann = OnlineAnnotator(tmp_path, {"reward": "classification", "batch_size": 80, "heldout_every": 4,
                                     "updates_first": 60, "lr": 0.1}, backend=Labeller(), embedder=Features())
    spool(tmp_path, messages)
    ann.step()
    rewards = table(tmp_path)
    assert all(rewards.get(m, 0.0) == 1.0 for m in messages if "gold" in m)
    assert not any(rewards.get(m, 0.0) for m in messages if "wall" in m)
    assert ann.status()["heldout_accuracy"] == 1.0
    assert (tmp_path / oni.MODEL).exists() and ann.model is not None and ann.model.steps == 60


def test_ranking_publishes_the_normalised_thresholded_reward_not_the_raw_score(tmp_path):
    """ONI's published code computed the normalised, thresholded ranking reward and then used the raw one."""

    class Scores:
        steps = 0

        def scores(self, x: np.ndarray) -> np.ndarray:
            return x[:, 0].astype(np.float64)

    class Raw:
        def embed(self, texts: list[str]) -> np.ndarray:
            return np.array([[float(t.split()[-1])] for t in texts])

    ann = OnlineAnnotator(tmp_path, {"reward": "ranking", "ranking_quantile": 0.5}, backend=Labeller(),
                          embedder=Raw())
    ann.model = Scores()  # type: ignore[assignment]
    spool(tmp_path, ["score 1", "score 2", "score 3", "score 4"])
    ann.poll()
    s = math.sqrt(1.25)
    assert ann.rewards() == pytest.approx({"score 1": 0.0, "score 2": 0.0, "score 3": 0.5 / s, "score 4": 1.5 / s})


def test_cosine_reward_needs_no_labels(tmp_path):
    backend = Labeller()
    sims = {"You kill the newt!": 0.31, "It's a wall.": 0.07}
    ann = OnlineAnnotator(tmp_path, {"reward": "cosine", "cosine_threshold": 0.2}, backend=backend,
                          embedder=Features(sims))
    spool(tmp_path, list(sims))
    ann.step()
    assert table(tmp_path) == pytest.approx({"You kill the newt!": 0.31}) and backend.asked == []


def test_annotator_resumes_labels_queue_and_model_without_asking_again(tmp_path):
    messages = [f"gold {i}" for i in range(6)] + [f"wall {i}" for i in range(6)]
    spool(tmp_path, messages)
    first = Labeller()
    cfg = {"reward": "classification", "batch_size": 4, "heldout_every": 0, "updates_first": 20, "updates_least": 2,
           "publish_s": 0}  # one batch a step
    ann = OnlineAnnotator(tmp_path, cfg, backend=first, embedder=Features())
    ann.step()
    ann.step()
    steps = ann.model.steps
    # a restart (the process was killed): a fresh annotator on the same directory
    second = Labeller()
    again = OnlineAnnotator(tmp_path, cfg, backend=second, embedder=Features())
    assert again.model is not None and again.model.steps == steps and again.batches == 2
    # the labeller's CPU time adds up over restarts: the new process starts from the last status the old one wrote
    assert again.cpu_before == json.loads((tmp_path / "status.json").read_text())["cpu_s"] > 0
    assert again.status()["cpu_s"] >= again.cpu_before + time.process_time() - 0.1
    again.step()
    assert again.status()["pending"] == 0 and again.status()["labels"] == 12
    assert sorted(first.asked + second.asked) == sorted(messages)  # every message paid for exactly once
    assert again.model.steps == steps + updates_for_batch(3, 20, 2)



class CountingEncoder:
    """A stand-in for the sentence model inside a real ``EmbeddingBackend``: a unit vector per text from a hash of
    it ("gold" texts lean towards a fixed direction), and a record of every text it was asked to encode."""

    def __init__(self) -> None:
        self.encoded: list[str] = []

    def encode(self, texts: list[str], **_) -> np.ndarray:
        self.encoded += texts
        out = []
        for t in texts:
            v = np.random.default_rng(int.from_bytes(t.encode()[:8].ljust(8, b"_"), "little") ^ len(t)).normal(size=16)
            v[0] += 4.0 * ("gold" in t)
            out.append(v / np.linalg.norm(v))
        return np.array(out, dtype=np.float32)


def test_the_queue_drains_on_a_stream_of_repeated_messages_each_message_encoded_and_labelled_once(tmp_path):
    """Ten producers spool an overlapping stream (each of 60 messages comes from ~8 of them, in flushes over time)
    while the annotator's own loop runs: the queue ends empty, every distinct message is labelled exactly once, the
    labeller and the classifier's features share one encoding per message, and the refits follow the batch schedule
    whatever the number of messages seen."""
    import threading

    from pipeline.llm.embedding import EmbeddingBackend
    from pipeline.nethack.annotation import nethack_goal

    messages = [f"You find {i} gold pieces." if i % 3 == 0 else f"It's a wall number {i}." for i in range(60)]
    rng = np.random.default_rng(0)
    producers = [[str(m) for m in rng.permutation(messages) if rng.random() < 0.8] for _ in range(10)]
    assert sum(map(len, producers)) > 6 * len(messages)  # most spooled lines repeat a message already spooled
    embedder = EmbeddingBackend()
    encoder = CountingEncoder()
    embedder._encoder[0] = encoder
    cfg = {"reward": "classification", "batch_size": 8, "updates_first": 40, "updates_least": 5, "heldout_every": 5,
           "poll_s": 0.01, "publish_s": 0.05}
    ann = OnlineAnnotator(tmp_path, cfg, embedder=embedder)  # the labeller: the default embedding annotator
    ann.prepare()  # what the process does before its loop: the encoder is used (loaded) before any message comes
    assert encoder.encoded == ["."]
    stop = threading.Event()
    worker = threading.Thread(target=ann.run, args=(stop.is_set,))
    worker.start()
    try:
        (tmp_path / oni.SEEN).mkdir()
        for flush in range(8):  # every producer flushes an eighth of its stream, then the next eighth ...
            for k, mine in enumerate(producers):
                part = mine[flush * len(mine) // 8: (flush + 1) * len(mine) // 8]
                with open(tmp_path / oni.SEEN / f"{k}.jsonl", "a") as f:
                    f.write("".join(json.dumps(m) + "\n" for m in part))
            time.sleep(0.02)
        deadline = time.monotonic() + 60
        status: dict = {}
        while time.monotonic() < deadline:
            status = json.loads((tmp_path / oni.STATUS).read_text()) if (tmp_path / oni.STATUS).exists() else {}
            if status.get("seen") == len(set().union(*producers)) and status.get("pending") == 0:
                break
            time.sleep(0.05)
    finally:
        stop.set()
        worker.join()
    assert ann.errors == 0
    distinct = set().union(*producers)
    assert status["seen"] == len(distinct) and status["pending"] == 0
    rows = [json.loads(line) for line in (tmp_path / oni.LABELS).read_text().splitlines()]
    assert sorted(r["message"] for r in rows) == sorted(distinct)  # each asked once
    assert set(ann.labels) == distinct and status["labels"] == len(distinct)
    goal = nethack_goal("defaultgoal")["embedding"]
    # one encoding per text for the labeller and the features (and the goal sentence, and the model's size probe)
    assert sorted(encoder.encoded) == sorted([*distinct, goal, "."])
    assert ann.model is not None
    assert ann.model.steps == sum(updates_for_batch(k, 40, 5) for k in range(1, ann.batches + 1))
    assert ann.batches < len(distinct)  # batched: far fewer refits than messages
    published = table(tmp_path)
    assert set(published) <= distinct and published  # the classifier's reward of seen messages
    assert {"cpu_label_s", "cpu_fit_s", "cpu_publish_s"} <= set(status)
    assert sum(status[f"cpu_{p}_s"] for p in ("label", "fit", "publish")) <= status["cpu_s"] + 0.1


# -- configuration --------------------------------------------------------------------------------------------
def test_oni_preset_gives_onis_coefficients_and_each_variant_its_reward_type(tmp_path):
    from pathlib import Path

    from pipeline.core.config import ConfigError, preset_overrides
    from pipeline.params import load_params
    from stages.evaluate_nethack import policy_names
    from stages.rl_nethack import sf_args

    (tmp_path / "params.yaml").write_text("{}\n")
    oni = preset_overrides(Path(__file__).resolve().parents[1] / "presets" / "oni.yaml")
    p = load_params(tmp_path / "params.yaml", oni)
    v = p.rl_nethack.variants
    assert {k: (x.reward, x.ext_coef, x.int_coef) for k, x in v.items()} == {
        "motif": ("motif", 0.1, 0.4), "extrinsic": ("none", 0.1, 0.0), "intrinsic": ("motif", 0.0, 0.4),
        "oni_retrieval": ("retrieval", 0.1, 0.4), "oni_classification": ("classification", 0.1, 0.4),
        "oni_ranking": ("ranking", 0.1, 0.4),
    }
    assert p.rl_nethack.extended_actions and p.rl_nethack.count_exponent == 3.0
    assert policy_names(p) == ["random", *v]
    # ELLM's cosine reward, the one more variant oni.yaml's header names
    cosine = load_params(tmp_path / "params.yaml", [
        *oni, "++rl_nethack.variants.oni_cosine={reward: cosine, ext_coef: 0.1, int_coef: 0.4}"])
    assert cosine.rl_nethack.variants["oni_cosine"].reward == "cosine" and len(cosine.rl_nethack.variants) == 7

    args = sf_args(p, "oni_ranking", v["oni_ranking"], Path("/t"), Path("/r"))
    assert "--intrinsic_reward=ranking" in args and "--reward_model_dir=" in args
    assert json.loads(next(a for a in args if a.startswith("--oni_config="))[13:])["ranking_quantile"] == 0.5
    assert "--intrinsic_reward=none" in sf_args(p, "extrinsic", v["extrinsic"], Path("/t"), Path("/r"))
    with pytest.raises(ConfigError, match="int_coef 0"):
        load_params(tmp_path / "params.yaml", ["rl_nethack.variants={x: {reward: none, ext_coef: 1, int_coef: 1}}",
                                               "evaluate_nethack.policies=[random, x]"])



def test_annotation_progress_goes_to_mlflow_by_env_step_and_to_one_dvc_plot_per_online_variant(tmp_path):
    import csv

    from pipeline.core.stage import StageContext
    from pipeline.nethack.sf import PROGRESS_COLUMNS
    from pipeline.params import load_params
    from stages.rl_nethack import report_oni

    (tmp_path / "params.yaml").write_text("{}\n")
    p = load_params(tmp_path / "params.yaml", [f"data_dir={tmp_path / 'data'}", "rl_nethack.variants={"
                    "ext: {reward: none, ext_coef: 1, int_coef: 0}, cls: {reward: classification, ext_coef: 0.1, "
                    "int_coef: 0.4}}", "evaluate_nethack.policies=[random, all]"])
    progress = p.data_path("rl_nethack", "cls", "oni", oni.PROGRESS)
    progress.parent.mkdir(parents=True)
    with open(progress, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=PROGRESS_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerow({"env_steps": 1024, "labels": 8, "pending": 30, "helpful_share": 0.25, "llm_sent": 8})
        w.writerow({"env_steps": 2048, "labels": 16, "pending": 22, "helpful_share": 0.5, "heldout_accuracy": 0.75})

    class Tracker:
        logged: list = []

        def log_metrics(self, metrics, step=None):
            self.logged.append((step, metrics))

    tracker = Tracker()
    metrics = report_oni(p, StageContext(tracker=tracker))  # type: ignore[arg-type]
    assert [step for step, _ in tracker.logged] == [1024, 2048]
    assert tracker.logged[0][1]["cls/oni_pending"] == 30 and tracker.logged[1][1]["cls/oni_heldout_accuracy"] == 0.75
    assert metrics["cls/oni_pending"] == 22 and metrics["cls/oni_labels"] == 16
    plots = sorted(p.plots_path("rl-nethack-oni").iterdir())
    assert [x.name for x in plots] == ["cls.csv"]  # extrinsic-only variants have no annotation to plot
    rows = list(csv.DictReader(open(plots[0])))
    assert [(r["env_steps"], r["pending"]) for r in rows] == [("1024", "30.0"), ("2048", "22.0")]


# -- a SIGKILLed online run -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_killed_online_run_resumes_labels_queue_model_and_checkpoint_without_paying_twice(tmp_path, monkeypatch):
    import signal
    import subprocess
    import sys
    import time
    from collections import Counter
    from pathlib import Path

    import psutil
    import yaml

    from pipeline.core.config import _set_dotted, parse_override
    from pipeline.nethack.sf import latest_checkpoint
    from pipeline.params import load_params
    from stages.rl_nethack import train_variant

    sys.path.insert(0, str(Path(__file__).parent))
    from fake_openai_server import CURIO_RULES, FakeServer

    server = FakeServer()
    server.configure(latency_s=0.3, rules=CURIO_RULES)
    project = tmp_path / "proj"
    project.mkdir()
    raw: dict = {}
    for o in ["tracking.enabled=false", "evaluate_nethack.policies=[random,all]",
              "rl_nethack.train_for_env_steps=500000", "rl_nethack.num_envs_per_worker=4", "rl_nethack.batch_size=256",
              "rl_nethack.max_episode_steps=400",
              "rl_nethack.variants={oni: {reward: classification, ext_coef: 0.1, int_coef: 0.4}}",
              "rl_nethack.extra_args=['--save_every_sec=2']", "rl_nethack.timeout_s=1500",
              "rl_nethack.oni.batch_size=8", "rl_nethack.oni.updates_first=20",
              f"rl_nethack.oni.annotator={{backend: openai, model: fake, base_url: '{server.base_url}', "
              "temperature: 0.1, top_p: 0.95, max_tokens: 256}"]:
        _set_dotted(raw, *parse_override(o))
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("CURIO_CACHE_DIR", str(tmp_path / "cache"))
    experiment = project / "data" / "rl_nethack" / "oni"
    labels = experiment / "oni" / oni.LABELS
    try:
        stage = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "stage", "rl-nethack"], cwd=project,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 600  # generous: the annotator loads torch and the embedder first
        while time.time() < deadline and not (
            (latest_checkpoint(experiment) or (None, 0))[1] > 0 and (experiment / "oni" / oni.MODEL).exists()
            and labels.exists() and len(labels.read_text().splitlines()) >= 16
        ):
            time.sleep(0.5)
        assert (experiment / "oni" / oni.MODEL).exists(), "no labels / model in time"
        children = psutil.Process(stage.pid).children(recursive=True)
        annotators = [p for p in children if "pipeline.nethack.oni" in " ".join(p.cmdline())]
        assert annotators
        for p in [stage, *annotators]:
            os.kill(p.pid, signal.SIGKILL)  # the stage and the annotator get no chance to clean up
        stage.wait()
        _, alive = psutil.wait_procs(children, timeout=60)
        assert not alive
        rows_before = len(labels.read_text().splitlines())
        _, steps_at_kill = latest_checkpoint(experiment)

        params = load_params(project / "params.yaml", [f"data_dir={project / 'data'}",
                                                       f"rl_nethack.train_for_env_steps={steps_at_kill + 2048}"])
        monkeypatch.chdir(project)
        resumed = train_variant(params, "oni", params.rl_nethack.variants["oni"])
        assert resumed["action"] == "resumed" and resumed["resumed_from_env_steps"] == steps_at_kill

        # The annotator's state as the runs left it: its model, labels and queue carry on.
        settings = {**params.rl_nethack.oni.model_dump(mode="json"), "reward": "classification"}
        annotator = OnlineAnnotator(experiment / "oni", settings)
        assert annotator.model is not None and annotator.model.steps > 0 and annotator.batches >= 2
        annotator.poll()
        assert annotator.status()["pending"] > 0
        for _ in range(3):
            annotator.step()
        rows = [json.loads(x) for x in labels.read_text().splitlines()]
        assert len(rows) > rows_before
        final = Counter(r["message"] for r in rows if r["label"] in oni.LABELLED)
        assert max(final.values()) == 1  # no message got a second label
        # every request the server saw is a row of labels.jsonl, except at most the batch cut by the kill
        assert server.stats()["requests"] <= len(rows) + 8
    finally:
        server.close()


def test_progress_rows_of_a_run_resumed_from_an_older_version_keep_the_files_columns(tmp_path):
    """A progress file begun before a column was added (cpu_s) gets rows in its own columns, so it still parses."""
    import csv
    from types import SimpleNamespace

    from pipeline.nethack.sf import PROGRESS_COLUMNS, _online_annotation
    from stages.rl_nethack import oni_progress

    cfg = SimpleNamespace(train_dir=str(tmp_path), experiment="cls", oni_config="{}", intrinsic_reward="classification",
                          seed=0, oni_refresh_s=2.0)
    directory = tmp_path / "cls" / "oni"
    directory.mkdir(parents=True)
    (directory / oni.STATUS).write_text(json.dumps({"labels": 3, "pending": 1, "cpu_s": 2.5}))
    old = [c for c in PROGRESS_COLUMNS if c != "cpu_s"]
    (directory / oni.PROGRESS).write_text(",".join(old) + "\n" + ",".join("1" for _ in old) + "\n")
    observer = _online_annotation(cfg)
    observer.start = time.time()
    observer.record(2048)
    with open(directory / oni.PROGRESS, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == old and all(len(r) == len(old) for r in rows) and len(rows) == 3
    params = SimpleNamespace(data_path=lambda *parts: tmp_path.joinpath(*parts[1:]))
    assert [r["env_steps"] for r in oni_progress(params, "cls")] == [1, 2048]
    (directory / oni.PROGRESS).unlink()  # a new run: every column, cpu_s included
    observer.record(4096)
    assert oni_progress(params, "cls")[0]["cpu_s"] == 2.5
