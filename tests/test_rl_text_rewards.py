"""rl-text's mixes (issue 28): ``rl_text.reward: judge``, the multi-turn-aware reward of each played utterance, on
numbers checked by hand; how filtered BC and ArCHer / CHAI learn from it; the curriculum that picks each round's
tasks from the learning policy's own rollouts; what the two switches change for DVC. The resume of the
curriculum's picks inside the stage is in tests/test_resume.py."""

import json
import math
import random
from pathlib import Path

import pytest
import yaml

from pipeline.core.config import ConfigError
from pipeline.core.stage import declaration
from pipeline.envs.base import make_game
from pipeline.envs.twenty_questions import knowledge_base
from pipeline.llm.base import ChatBackend, Generation, Sampling
from pipeline.params import load_params
from pipeline.rl_text.archer import transitions
from pipeline.rl_text.filtered_bc import top_by_turn_reward
from pipeline.text.curriculum import OnlineCurriculum
from pipeline.text.multiturn_pairs import ContinuationJudge, utterance_rewards

REPO = Path(__file__).resolve().parents[1]


def h2(p):
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


class Scripted(ChatBackend):
    """A policy answering from a function of the conversation; tokens_out = words of the answer."""

    def __init__(self, fn):
        super().__init__("scripted")
        self.fn = fn

    def generate(self, conversations, sampling):
        texts = [self.fn(c) for c in conversations]
        return [Generation(text=t, tokens_out=len(t.split())) for t in texts]


def ask(question, reply):
    return [{"role": "assistant", "content": f"<Answer>{question}</Answer>"}, {"role": "user", "content": reply}]


def test_judge_reward_of_each_played_utterance_by_hand():
    """A played game of "dog" (17 mammals): "cat?" (No.), then "dog?" (Goal reached). Rules judge, 2 continuations
    of 1 agent turn each, played by the round's policy, which answers "dog?" then "cat?" (one per continuation).
    R = (interactivity + information gain) / 2 + accuracy − 5e-4·tokens, tokens = the utterance's (4 words) +
    the continuation's; each utterance's reward = the mean R of its continuations."""
    game = make_game("twenty_questions")
    task = next(t for t in game.tasks("train") if t.task_id == "dog")
    conv = game.conversation_start(task) + ask("Is it a cat?", "No.") + ask("Is it a dog?", "Goal reached")
    row = {"group": "twenty_questions", "task_id": "dog", "secret": json.dumps(task.env), "category": task.agent,
           "difficulty": task.difficulty, "split": "train", "sample": 0, "conversation": conv}
    moves = iter(["Is it a dog?", "Is it a cat?"] * 4)
    policy = Scripted(lambda c: f"<Answer>{next(moves)}</Answer>")
    cfg = load_params(REPO / "params.yaml", ["rl_text.reward=judge", "rl_text.judge_reward.num_samples=2",
                                             "rl_text.judge_reward.window_size=1"]).rl_text.judge_reward
    stats = {"continuations": 0}
    got = utterance_rewards(policy, ContinuationJudge(cfg.judge), [row], {"twenty_questions": game}, cfg,
                            Sampling(), seed=0, max_format_retries=0, count_tokens=lambda t: len(t.split()),
                            stats=stats)
    n = len(knowledge_base().members("mammal"))
    assert n == 17
    # "cat?": No. (16 left), then the policy asks "dog?" (found: accuracy 1) in one continuation ...
    cat_then_dog = ((h2(1 / n) + h2(1 / (n - 1))) / 2 + 1) / 2 + 1 - 5e-4 * 8
    # ... and "cat?" again in the other (an answer already known: split 0; nothing more learnt; not found).
    cat_then_cat = ((h2(1 / n) + 0) / 2 + (1 - math.log2(n - 1) / math.log2(n))) / 2 - 5e-4 * 8
    # "dog?" after "cat?": 1 of 16 left, found; the game ends, the policy plays no more.
    dog = (h2(1 / (n - 1)) + 1) / 2 + 1 - 5e-4 * 4
    assert got == [pytest.approx([(cat_then_dog + cat_then_cat) / 2, dog])]
    assert stats["continuations"] == 4


def test_archer_transitions_pay_the_utterance_rewards():
    conv = [{"role": "system", "content": "rules"}, {"role": "user", "content": "go"},
            *ask("Is it alive?", "Yes"), *ask("cat", "Correct")]
    row = {"group": "twenty_questions", "task_id": "t", "sample": 0, "conversation": conv, "success": True,
           "reward": 1.0}
    judged = transitions(row, 0, score_by_turns=True, turn_rewards=[0.25, 1.5])
    assert [t["reward"] for t in judged] == [0.25, 1.5] and [t["done"] for t in judged] == [False, True]
    assert [t["reward"] for t in transitions(row, 0, score_by_turns=True)] == [-1.0, 0.0]  # outcome unchanged
    with pytest.raises(ValueError, match="1 utterance rewards for 2 utterances"):
        transitions(row, 0, score_by_turns=True, turn_rewards=[0.5])


def test_filtered_bc_with_judge_rewards_ranks_by_the_mean_utterance_reward():
    long_loss = {"invalid": False, "turn_rewards": [0.9] * 20}  # sum 18, mean 0.9
    short_win = {"invalid": False, "turn_rewards": [1.2, 1.8]}  # sum 3, mean 1.5
    tied = {"invalid": False, "turn_rewards": [1.5]}
    broken = {"invalid": True, "turn_rewards": [5.0]}  # format-invalid: never cloned
    rows = [long_loss, broken, short_win, tied]
    assert top_by_turn_reward(rows, 0.5) == [short_win, tied]  # ties keep play order
    assert top_by_turn_reward(rows, 1.0) == [short_win, tied, long_loss]
    assert top_by_turn_reward([broken], 1.0) == []


def episode_rows(scores):
    """Rows of one round: {task: [score per sample]}."""
    return [{"group": "g", "task_id": task, "sample": s, "score": float(x)}
            for task, xs in scores.items() for s, x in enumerate(xs)]


def test_online_curriculum_picks_from_the_rounds_own_rows():
    arms = {"g/e1": "easy", "g/e2": "easy", "g/h1": "hard", "g/h2": "hard"}
    played: dict[int, list[dict]] = {}

    def make():
        return OnlineCurriculum(arms, alpha=0.0, per_round=2, k=2, rng_of=lambda i: random.Random(i),
                                rows_of=lambda i: played[i])

    first = make().picks(0)
    assert sorted(arms[k] for k in first) == ["easy", "hard"]  # both arms unexplored: one pick each
    # Round 0 as the policy played it: the hard task's turns vary (something to learn), the easy one's do not.
    easy, hard = (k.split("/")[1] for k in sorted(first))
    played[0] = episode_rows({easy: [5, 5], hard: [2, 8]})
    assert {arms[k] for k in make().picks(1)} == {"hard"}
    assert sorted(make().episodes(1)) == [("g/h1", 0), ("g/h1", 1), ("g/h2", 0), ("g/h2", 1)]
    # The same round played otherwise: the picks follow the rows.
    played[0] = episode_rows({easy: [1, 9], hard: [4, 4]})
    assert {arms[k] for k in make().picks(1)} == {"easy"}
    # A task picked twice in a round (its arm has no other task left) gets samples k..2k-1 the second time.
    solo = OnlineCurriculum({"g/only": "easy"}, 0.0, per_round=2, k=2, rng_of=random.Random, rows_of=played.get)
    assert solo.episodes(0) == [("g/only", 0), ("g/only", 1), ("g/only", 2), ("g/only", 3)]
    # Rows that are not the round's picks are refused, not silently learnt from.
    played[0] = episode_rows({easy: [1, 9]})
    with pytest.raises(RuntimeError, match="episodes of"):
        make().picks(1)


@pytest.mark.parametrize("override", ["rl_text.reward=judge", "rl_text.curriculum.enabled=true"])
def test_switching_the_reward_or_the_curriculum_makes_rl_text_alone_stale(override):
    """Both are rl_text keys: rl-text's params hash (its resume key) changes and dvc.yaml's rl-text params cover
    them, so `dvc status` shows rl-text (and what reads its model) changed. rl_text.reward is also declared by
    the two stages of the motif reward (tests/test_motif_text.py), idle for judge: they rerun in a second and
    write the same bytes, so nothing downstream of them reruns. The judge's continuations are played by rl-text's
    own policy: no other input is needed."""
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    key = override.split("=")[0]
    base, changed = load_params(REPO / "params.yaml"), load_params(REPO / "params.yaml", [override])
    declaring = [name for name, entry in spec.items()
                 if any(key == p or key.startswith(p + ".") for p in entry.get("params", []))]
    idle_unless_motif = ["annotate-utterances", "train-reward-text"] if key == "rl_text.reward" else []
    # check-params' stamp is the same bytes: it reruns nothing
    assert declaring == ["check-params", *idle_unless_motif, "rl-text"]
    stage = declaration("rl-text")
    assert stage.slice(changed).section_hash(stage.params) != stage.slice(base).section_hash(stage.params)
    assert stage.needs(changed) == stage.needs(base)
    assert {"pipeline/text/curriculum.py", "pipeline/text/multiturn_pairs.py", "pipeline/text/multiturn_reward.py",
            "pipeline/text/prompts/multiturn_judge.yaml"} <= set(spec["rl-text"]["deps"])


def test_default_is_the_outcome_reward_without_curriculum():
    cfg = load_params(REPO / "params.yaml").rl_text
    assert (cfg.reward, cfg.curriculum.enabled) == ("outcome", False)


@pytest.mark.parametrize(("overrides", "needle"), [
    (["rl_text.reward=motif", "games.groups=[wordle]"], "annotate_utterances.judge"),
    (["rl_text.reward=bandit"], "rl_text.reward"),
    (["rl_text.reward=oni", "games.groups=[wordle]"], "rl_text.reward"),
    (["rl_text.reward=judge", "games.groups=[wordle]"], "rl_text.reward"),
    (["rl_text.curriculum.enabled=true", "rl_text.trajectories_per_task=1"], "trajectories_per_task"),
    (["rl_text.judge_reward.judge.backend=embedding"], "rl_text"),
])
def test_a_bad_combination_is_refused_when_params_load(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_params(REPO / "params.yaml", overrides)
    # an LLM judge scores any game; the rules judge the knowledge-base games
    load_params(REPO / "params.yaml", ["rl_text.reward=judge", "games.groups=[twenty_questions,guess_my_city]"])
