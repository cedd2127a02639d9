"""rl_text.reward: motif (issue 28): Motif's reward for the text agent. Pairs of moves of one task, the judges that
prefer one (rules from the knowledge base; an LLM through Motif's prompt discipline), the soft-label
Bradley-Terry fit with Motif's normalisation and threshold, the reward rl-text pays per move — each on numbers
checked by hand — and the stages end to end (annotate-utterances → train-reward-text → rl-text), idle for the
other rewards, a missing reward model refused in one line, and what switching the reward makes stale for DVC.
The resume of a motif round is in tests/test_resume.py."""

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import SMALL, curio, make_project, stage_here

from pipeline.core.artifacts import read_rows, read_table
from pipeline.core.stage import declaration
from pipeline.envs.base import make_game
from pipeline.llm.base import ChatBackend, Generation
from pipeline.llm.config import LLMConfig
from pipeline.models.reward_net import RewardNetConfig, fit_reward_model, load_reward_model, soft_bt_loss
from pipeline.params import load_params
from pipeline.text.turn_rewards import motif_rewards, outcome_rewards
from pipeline.text.utterance_prefs import (
    UtterancePreferenceJudge,
    exact_move_reward,
    parse_preference,
    utterance_pairs,
    utterance_text,
)

REPO = Path(__file__).resolve().parents[1]


def h2(p):
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def ask(question, reply):
    return [{"role": "assistant", "content": f"<Answer>{question}</Answer>"}, {"role": "user", "content": reply}]


def dog_row(sample, *turns, invalid=False):
    game = make_game("twenty_questions")
    task = next(t for t in game.tasks("train") if t.task_id == "dog")
    conv = game.conversation_start(task) + [m for q, a in turns for m in ask(q, a)]
    return {"group": "twenty_questions", "task_id": "dog", "secret": json.dumps(task.env), "category": task.agent,
            "difficulty": task.difficulty, "split": "train", "sample": sample, "conversation": conv,
            "invalid": invalid, "success": turns[-1][1] == "Goal reached", "final_action": None}


# -- the formulas --------------------------------------------------------------------------------------------------
def test_motif_reward_of_an_episode_by_hand():
    """r_int = 1[r̃ > ε]·r̃ / N^β: N counts the same move (whitespace aside) so far in the episode."""
    r = [1.0, -0.5, 2.0, 2.0]
    moves = ["a", "b", "c", " c "]
    assert motif_rewards(r, moves, threshold=0.0, count_exponent=3.0) == [1.0, 0.0, 2.0, 2.0 / 8]
    assert motif_rewards(r, moves, threshold=None, count_exponent=3.0) == [1.0, -0.5, 2.0, 0.25]
    assert motif_rewards(r, moves, threshold=1.5, count_exponent=0.0) == [0.0, 0.0, 2.0, 2.0]


def test_outcome_reward_per_utterance():
    won = dog_row(0, ("Is it a cat?", "No."), ("Is it a dog?", "Goal reached"))
    lost = dog_row(1, ("Is it a cat?", "No."), ("Is it a cow?", "No."))
    assert outcome_rewards(won, score_by_turns=True) == [-1.0, 0.0]
    assert outcome_rewards(lost, score_by_turns=True) == [-1.0, -1.0]
    assert outcome_rewards({**lost, "reward": 0.7}, score_by_turns=False) == [0.0, 0.7]


def test_soft_bradley_terry_loss_on_move_pairs_by_hand():
    """−[(1 − y)·log σ(r1 − r2) + y·log σ(r2 − r1)], averaged: (r1, r2, y) = (1, 0, 0) and (0, 0, 0.5)."""
    loss = soft_bt_loss(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]), torch.tensor([0.0, 0.5]))
    assert loss.item() == pytest.approx((math.log(1 + math.exp(-1)) + math.log(2)) / 2)


def test_fit_normalises_by_the_training_moves_as_they_occur_and_thresholds_at_a_quantile():
    """μ, σ: over the training pairs' texts weighted by how often they occur (good ×3, bad ×2, meh ×1); the 0.5
    quantile of (r − μ)/σ over the three distinct texts is the middle one's."""
    first, second = ["good", "good", "meh", "x"], ["bad", "bad", "good", "y"]
    y = np.array([0.0, 0.0, 1.0, 0.5], dtype=np.float32)
    is_train = np.array([True, True, True, False])
    fit = fit_reward_model(first, second, y, is_train, RewardNetConfig(max_len=16), epochs=30, batch_size=2, lr=1e-2,
                           weight_decay=0.0, seed=0, shuffle_seed=1)
    raw = dict(zip(fit.texts, fit.model.score(fit.texts), strict=True))
    w = {"good": 3, "bad": 2, "meh": 1}
    mean = sum(w[t] * raw[t] for t in w) / 6
    std = math.sqrt(sum(w[t] * (raw[t] - mean) ** 2 for t in w) / 6)
    assert (fit.stats.mean, fit.stats.std) == (pytest.approx(mean), pytest.approx(std))
    z = sorted((raw[t] - mean) / std for t in w)
    assert fit.stats.threshold(0.5) == pytest.approx(z[1])
    assert fit.stats.threshold(None) is None
    assert raw["good"] > raw["bad"] and raw["good"] > raw["meh"]  # the judge's order (y = 1: the second wins)
    assert fit.metrics["train_agreement"] == 1.0 and fit.metrics["train_pairs"] == 3


# -- pairs and judges ----------------------------------------------------------------------------------------------
def test_pairs_are_the_same_turn_of_two_plays_of_one_task():
    rows = [dog_row(0, ("Is it a cat?", "No."), ("Is it a dog?", "Goal reached")),
            dog_row(1, ("Is it a cow?", "No.")),
            dog_row(2, ("Is it big?", "No."), ("Is it a dog?", "Goal reached"))]
    rows[1]["conversation"].append({"role": "assistant", "content": "no answer tags"})  # its unplayable last move
    rows[1]["invalid"] = True
    pairs = utterance_pairs(rows, 100, random.Random(0))
    assert [(p.rows[0]["sample"], p.rows[1]["sample"], p.turn) for p in pairs] == [(0, 1, 0), (0, 2, 0), (0, 2, 1),
                                                                                   (1, 2, 0)]
    assert len(utterance_pairs(rows, 2, random.Random(0))) == 2


def test_the_reward_model_reads_the_move_first_then_the_turns_before_it_newest_first():
    conv = dog_row(0, ("Is it a cat?", "No."), ("Is it a dog?", "Goal reached"))["conversation"]
    assert utterance_text(conv, 4, 2) == ("<Answer>Is it a dog?</Answer>\n<user> No.\n"
                                          "<assistant> <Answer>Is it a cat?</Answer>")
    assert utterance_text(conv, 2, 4) == "<Answer>Is it a cat?</Answer>"  # the opening prompt is never read


def test_rules_judge_prefers_the_move_worth_more_by_hand():
    """The dog task (17 mammals). "cat?" (No.): split h2(1/17), a 16-of-17 entropy drop, not found; "dog?"
    (Goal reached): split h2(1/17), everything learnt, found. R = mean(split, gain) + accuracy."""
    game = make_game("twenty_questions")
    cat = dog_row(0, ("Is it a cat?", "No."))
    dog = dog_row(1, ("Is it a dog?", "Goal reached"))
    task = next(t for t in game.tasks("train") if t.task_id == "dog")
    r_cat = exact_move_reward(game, task, cat["conversation"], 2)
    r_dog = exact_move_reward(game, task, dog["conversation"], 2)
    assert r_cat == pytest.approx((h2(1 / 17) + 1 - math.log2(16) / math.log2(17)) / 2)
    assert r_dog == pytest.approx((h2(1 / 17) + 1) / 2 + 1)
    judge = UtterancePreferenceJudge(LLMConfig(backend="rules", model="exact"), {"twenty_questions": game}, 2)
    pairs = utterance_pairs([cat, dog], 10, random.Random(0))
    assert [a.label for a in judge.judge(pairs)] == ["SECOND"]
    assert [a.label for a in judge.judge(utterance_pairs([cat, {**cat, "sample": 5}], 10, random.Random(0)))] == [
        "TIE"]  # the same move in the same context: a tie, nothing asked


class Answers(ChatBackend):
    """Answers in turn from a list, counting requests."""

    def __init__(self, answers):
        super().__init__("answers")
        self.answers, self.requests = list(answers), []

    def generate(self, conversations, sampling):
        self.requests.extend(conversations)
        return [Generation(text=self.answers.pop(0), tokens_in=10, tokens_out=5) for _ in conversations]


def test_llm_judge_asks_motifs_way_one_retry_then_unknown():
    game = make_game("twenty_questions")
    cat = dog_row(0, ("Is it a cat?", "No."))
    dog = dog_row(1, ("Is it a dog?", "Goal reached"))
    pairs = utterance_pairs([cat, dog], 10, random.Random(0))
    backend = Answers(["Both are questions.", 'Then ("best_move": 2)'])
    judge = UtterancePreferenceJudge(LLMConfig(backend="hf", model="judge"), {"twenty_questions": game}, 2, backend)
    [got] = judge.judge(pairs)
    assert got.label == "SECOND" and "[retry]" in got.raw and got.usage.attempts == 2
    first, retry = backend.requests
    assert "Is it a cat?" in first[-1]["content"] and "Is it a dog?" in first[-1]["content"]
    assert '"dog"' in first[-1]["content"] or "dog" in first[-1]["content"]  # the judge knows the secret
    assert retry[-1]["content"].startswith("So, which move is better?")
    backend.answers = ["no idea", "still no idea"]
    assert [a.label for a in judge.judge(pairs)] == ["UNKNOWN"]
    assert [parse_preference(t) for t in ['("best_move": None)', "best_move: 1", '"BEST_MOVE": 2', "1"]] == [
        "TIE", "FIRST", "SECOND", "UNKNOWN"]


# -- the stages ----------------------------------------------------------------------------------------------------
TINY_BOOTSTRAP = ["bootstrap.episodes=24", "bootstrap.epochs=1", "bootstrap.n_layer=1", "bootstrap.n_embd=32",
                  "bootstrap.n_head=2", "bootstrap.vocab_size=800", "bootstrap.batch_size=4",
                  "bootstrap.n_positions=512"]
# the tiny policy rarely writes <Answer> tags: its first lines are its moves, so the knowledge base can judge them
MOTIF_RUN = [*TINY_BOOTSTRAP, "policy.free_answers=true", "rollout_text.max_new_tokens=16",
             "tracking.enabled=false", "rl_text.reward=motif", "rl_text.rounds=1", "rl_text.tasks_per_round=4",
             "rl_text.trajectories_per_task=2", "rl_text.epochs=1", "rl_text.batch_size=4",
             "annotate_utterances.num_pairs=300", "train_reward_text.epochs=3"]


def test_motif_stages_end_to_end_and_idle_for_the_other_rewards(tmp_path):
    """The stages that succeed run in this process (conftest's stage_here); the refusals are `curio stage`'s own,
    in a process of their own (its exit code and its one line are the point)."""
    proj = make_project(tmp_path, [*SMALL, "games.max_train_tasks=6", "rollout_text.trajectories_per_task=3",
                                   *MOTIF_RUN])
    for name in ("bootstrap", "rollout-text"):
        stage_here(name, proj)
    # rl-text with motif but no reward model yet: one line, exit 2, naming the stages to run
    (proj / "data" / "train_policy").mkdir(parents=True)
    import shutil
    shutil.copytree(proj / "data" / "bootstrap" / "model", proj / "data" / "train_policy" / "dpo")
    res = curio(["stage", "rl-text"], proj, check=False)
    assert res.returncode == 2 and "run train-reward-text first" in res.stderr and "Traceback" not in res.stderr
    for name in ("annotate-utterances", "train-reward-text"):
        stage_here(name, proj)
    pairs = read_table(proj / "data" / "annotate_utterances").to_pylist()
    assert len(pairs) == 300 and {p["label"] for p in pairs} <= {"FIRST", "SECOND", "TIE"}
    assert all(p["group"] == "twenty_questions" and p["text_first"].startswith(p["move_first"].strip())
               for p in pairs)
    stats = json.loads((proj / "data" / "reward_model_text" / "stats.json").read_text())
    assert stats["context_messages"] == 4 and stats["metrics"]["train_pairs"] > 0
    stage_here("rl-text", proj)
    rows = read_rows(proj / "data" / "rl_text" / "rollouts")
    model, rstats = load_reward_model(proj / "data" / "reward_model_text")
    eps = rstats.threshold(0.5)
    for row in rows:  # the stored rewards are the model's, normalised, thresholded, count-discounted
        conv = row["conversation"]
        idx = [i for i in range(2, len(conv)) if conv[i]["role"] == "assistant"]
        z = rstats.normalize(model.score([utterance_text(conv, i, 4) for i in idx]))
        assert row["turn_rewards"] == pytest.approx(motif_rewards(list(z), [conv[i]["content"] for i in idx], eps, 3.0))
    metrics = json.loads((proj / "metrics" / "stages" / "rl-text.json").read_text())
    assert 0 < metrics["rl/motif/above_threshold"] < 1

    # another reward: both stages idle in a second, their outputs say why, rl-text needs no reward model
    for name in ("annotate-utterances", "train-reward-text"):
        stage_here(name, proj, ["rl_text.reward=outcome"])
        idle = json.loads((proj / "data" / name.replace("-", "_").replace("train_reward_text", "reward_model_text")
                           / "idle.json").read_text())
        assert "rl_text.reward: motif" in idle["idle"]
    res = curio(["stage", "rl-text", "-S", "rl_text.reward=motif"], proj, check=False)
    assert res.returncode == 2 and "run annotate-utterances and train-reward-text" in res.stderr


def test_switching_to_motif_makes_exactly_its_stages_and_rl_text_stale():
    """rl_text.reward is declared by rl-text and the two Motif stages (idle otherwise, always the same bytes then):
    a switch to motif reruns annotate-utterances, train-reward-text and rl-text, and what reads rl-text's model;
    the other text stages' params hashes do not move."""
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    declaring = [name for name, entry in spec.items()
                 if any("rl_text.reward" == p or "rl_text.reward".startswith(p + ".") for p in entry.get("params", []))]
    assert declaring == ["check-params", "annotate-utterances", "train-reward-text", "rl-text"]
    assert "data/reward_model_text" in spec["rl-text"]["deps"]
    assert "data/annotate_utterances" in spec["train-reward-text"]["deps"]
    base, motif = load_params(REPO / "params.yaml"), load_params(REPO / "params.yaml", ["rl_text.reward=motif"])
    for name in ("annotate-utterances", "train-reward-text", "rl-text"):
        stage = declaration(name)
        assert stage.slice(motif).section_hash(stage.params) != stage.slice(base).section_hash(stage.params)
    assert declaration("rl-text").needs(motif) == [*declaration("rl-text").needs(base), "data/reward_model_text"]
    # annotate-utterances' own settings are its and train-reward-text's only
    key = "annotate_utterances.num_pairs"
    assert [n for n, e in spec.items() if any(key.startswith(p + ".") or key == p for p in e.get("params", []))] == [
        "check-params", "annotate-utterances"]
