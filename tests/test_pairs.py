import json
import math
import random
import shutil
from pathlib import Path

import pytest

from pipeline.core.config import ConfigError
from pipeline.envs.base import make_game
from pipeline.envs.twenty_questions import knowledge_base
from pipeline.llm.base import ChatBackend, Generation, Sampling
from pipeline.llm.config import LLMConfig
from pipeline.params import load_params
from pipeline.text.multiturn_pairs import (
    UNPARSEABLE_REWARD,
    Candidate,
    ContinuationJudge,
    Scores,
    candidate_reward,
    choose_pair,
    exact_scores,
    multiturn_chunk,
    split_quality,
    task_states,
)
from pipeline.text.multiturn_reward import RewardWeights
from pipeline.text.play import history_of, resume_episodes
from stages.pairs_text import build, effective_success, split_task

REPO = Path(__file__).resolve().parents[1]


def traj(sample, success, turns, judge="VALID", invalid=False):
    conv = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": f"a{sample}"}, {"role": "user", "content": "r"}]
    return {"group": "g", "task_id": "t", "sample": sample, "success": success, "turns": turns,
            "judge_label": judge, "invalid": invalid, "conversation": conv}


def test_chosen_within_threshold_rejected_worse_or_failed():
    rows = [traj(0, True, 5), traj(1, True, 6), traj(2, True, 9), traj(3, False, 20), traj(4, True, 7)]
    chosen, rejected = split_task(rows, threshold=2, strategy="as_failure")
    assert [r["sample"] for r in chosen] == [0, 1, 4]  # best 5 → turns ≤ 7
    assert [r["sample"] for r in rejected] == [2, 3]  # 9 > 7, and the failure


def test_judge_label_strategies():
    bad = traj(0, True, 3, judge="NOTVALID")
    assert effective_success(bad, "as_success") is True
    assert effective_success(bad, "as_failure") is False
    assert effective_success(bad, "drop") is None
    assert effective_success(traj(1, True, 3, invalid=True), "as_success") is None


def test_build_pairs_in_trl_conversational_format():
    rows = [traj(0, True, 4), traj(1, False, 20), traj(2, True, 12)]
    pairs, sft = build(rows, threshold=1, strategy="as_failure", pairs_per_task=1, rng=random.Random(0))
    assert len(pairs) == 1 and len(sft) == 1
    p = pairs[0]
    assert p["prompt"] == rows[0]["conversation"][:2]
    assert p["chosen"] == [{"role": "assistant", "content": "a0"}, {"role": "user", "content": "r"}]
    assert p["rejected"][0]["content"] in {"a1", "a2"}


def test_no_pair_without_a_success_or_without_a_worse_one():
    assert build([traj(0, False, 20)], 2, "as_failure", 1, random.Random(0))[0] == []
    assert build([traj(0, True, 4), traj(1, True, 5)], 2, "as_failure", 1, random.Random(0))[0] == []


def test_filtered_bc_keeps_best_fraction_and_skips_invalid():
    from pipeline.rl_text.filtered_bc import top_fraction

    rows = [traj(0, False, 20), traj(1, True, 9), traj(2, True, 4), traj(3, True, 6, invalid=True)]
    assert [r["sample"] for r in top_fraction(rows, 0.5)] == [2, 1]
    assert [r["sample"] for r in top_fraction(rows, 0.01)] == [2]
    assert top_fraction([traj(0, False, 3, invalid=True)], 0.5) == []


# -- strategy: multiturn (per-turn pairs, CollabLLM-style multi-turn-aware reward) ------------------------------
# A four-animal knowledge base: questions are attribute names or "is it a <name>?" guesses.
ANIMALS = {"cat": {"pet"}, "dog": {"pet", "barks"}, "cow": {"farm"}, "owl": {"flies"}}


def toy_consistent(history):
    left = set(ANIMALS)
    for question, reply in history:
        yes = reply.lower().startswith(("yes", "goal"))
        if question.startswith("is it a "):
            name = question.removeprefix("is it a ").rstrip("?")
            left = {a for a in left if (a == name) == yes}
        else:
            left = {a for a in left if (question in ANIMALS[a]) == yes}
    return left


def h2(p):
    return -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def test_exact_scores_on_a_toy_knowledge_base():
    # "pet" splits {cat, dog, cow, owl} 2/2 (1 bit); "barks" splits {cat, dog} 1/1 (1 bit): interactivity 1.
    # 2 bits of uncertainty before, 0 after (only cat is left): information gain 1.
    s = exact_scores(toy_consistent, [], [("pet", "Yes"), ("barks", "No")], accuracy=0.0)
    assert (s.interactivity, s.information_gain) == pytest.approx((1.0, 1.0))
    # "flies" splits 1/3 of 4 -> H(1/4) = 0.8113; then "farm" 1 of the 3 left -> H(1/3) = 0.9183.
    # {cat, dog} left: 1 bit of 2 removed -> 0.5.
    s = exact_scores(toy_consistent, [], [("flies", "No"), ("farm", "No")], accuracy=0.0)
    assert s.interactivity == pytest.approx((0.8113 + 0.9183) / 2, abs=1e-4)
    assert s.information_gain == pytest.approx(0.5)
    # A question whose answer is known already splits nothing; a guess of one of two splits evenly.
    assert split_quality(toy_consistent, [("pet", "Yes")], "flies") == 0.0
    assert split_quality(toy_consistent, [("pet", "Yes")], "is it a dog?") == pytest.approx(1.0)
    # The history before the candidate counts for neither score: from {cat, dog}, "barks" gains all of 1 bit.
    s = exact_scores(toy_consistent, [("pet", "Yes")], [("barks", "Yes")], accuracy=1.0)
    assert (s.accuracy, s.interactivity, s.information_gain) == (1.0, 1.0, 1.0)
    # R = 1 * mean(1, 1) + 1 * 1 - 5e-4 * 40 = 1.98
    assert candidate_reward(s, 40, RewardWeights()) == pytest.approx(1.98)


def test_rewards_are_averaged_per_candidate_and_extremes_chosen():
    cands = [Candidate("a", 1, [0.2, 0.4, 0.6]),  # mean 0.4
             Candidate("b", 1, [0.9, 0.7, 0.8]),  # mean 0.8
             Candidate("c", 1, [0.1, 0.0, 0.2]),  # mean 0.1
             Candidate("d", 1, [])]  # no scored continuation: left out
    pref = choose_pair(cands, min_margin=0.0)
    assert (pref.chosen.text, pref.rejected.text) == ("b", "c")
    assert pref.mean_rewards == pytest.approx((0.4, 0.8, 0.1))
    assert (pref.chosen_reward, pref.rejected_reward) == pytest.approx((0.8, 0.1))
    tie = [Candidate("a", 1, [0.5, 0.3]), Candidate("b", 1, [0.4])]  # both 0.4: no pair
    assert choose_pair(tie, 0.0) is None
    assert choose_pair([Candidate("a", 1, [0.5]), Candidate("b", 1, [0.45])], 0.1) is None
    assert choose_pair([Candidate("a", 1, [0.5]), Candidate("b", 1, [])], 0.0) is None


def row(sample, conversation, invalid=False, **extra):
    return {"group": "twenty_questions", "task_id": "dog", "secret": json.dumps("dog"), "category": "mammal",
            "difficulty": "medium", "split": "train", "sample": sample, "conversation": conversation,
            "invalid": invalid, "success": False, "turns": (len(conversation) - 2) // 2, **extra}


def turns(*pairs):
    out = []
    for action, reply in pairs:
        out += [{"role": "assistant", "content": f"<Answer>{action}</Answer>"}, {"role": "user", "content": reply}]
    return out


def test_task_states_are_distinct_prefixes_where_the_agent_moves():
    start = [{"role": "system", "content": "s"}, {"role": "user", "content": "Ask!"}]
    rows = [row(0, start + turns(("Is it big?", "No."), ("Is it a cat?", "No."))),
            row(1, start + turns(("Is it big?", "No."), ("Is it a dog?", "Goal reached"))),
            row(2, start + turns(("Does it fly?", "No.")), invalid=True)]  # its next turn failed to parse
    states = task_states(rows, 10, random.Random(0))
    # root (shared by all three), after "big" (shared by 0 and 1), after "fly" (the invalid one's failed turn)
    assert [(len(p), t) for p, t in states] == [(2, 0), (4, 1), (4, 1)]
    assert states[2][0][-2]["content"] == "<Answer>Does it fly?</Answer>"
    two = task_states(rows, 2, random.Random(0))
    assert len(two) == 2 and two == task_states(rows, 2, random.Random(0))  # seeded
    assert all(s in states for s in two)


class Scripted(ChatBackend):
    """A policy answering from a function of the conversation; tokens_out = words of the answer."""

    def __init__(self, fn):
        super().__init__("scripted")
        self.fn, self.calls = fn, 0

    def generate(self, conversations, sampling):
        self.calls += 1
        return [Generation(text=(t := self.fn(c)), tokens_out=len(t.split())) for c in conversations]


def test_resume_episodes_replays_the_prefix_and_plays_a_window():
    game = make_game("twenty_questions")
    task = next(t for t in game.tasks("train") if t.task_id == "dog")
    start = game.conversation_start(task)
    # The recorded reply stays as it was ("Yes, it is!" is not what the oracle would say), and is not re-asked.
    prefix = start + turns(("Is it alive?", "Yes, it is!")) + [
        {"role": "assistant", "content": "<Answer>Is it a cat?</Answer>"}]
    assert history_of(prefix) == [("Is it alive?", "Yes, it is!"), ("Is it a cat?", None)]
    policy = Scripted(lambda c: "<Answer>Is it alive?</Answer>")
    rows = resume_episodes(policy, [(game, task, 0, prefix)], Sampling(), seed=0, max_new_turns=2)
    r = rows[0]
    assert r["conversation"][:len(prefix)] == prefix
    assert [m["content"] for m in r["conversation"][len(prefix):]] == [
        "No.", "<Answer>Is it alive?</Answer>", "Yes.", "<Answer>Is it alive?</Answer>", "Yes."]
    assert (r["start_turns"], r["turns"], r["success"], r["tokens_out"]) == (1, 4, False, 6)  # 2 x 3 words
    # max_new_turns=0: only the reply to the trailing turn; a correct trailing guess ends the game.
    win = prefix[:-1] + [{"role": "assistant", "content": "<Answer>Is it a dog?</Answer>"}]
    policy.calls = 0
    rows = resume_episodes(policy, [(game, task, 0, prefix), (game, task, 1, win)], Sampling(), seed=0,
                           max_new_turns=0)
    assert [r["conversation"][-1]["content"] for r in rows] == ["No.", "Goal reached"]
    assert [r["success"] for r in rows] == [False, True] and policy.calls == 0  # no new generation
    with pytest.raises(ValueError, match="no <Answer>"):
        history_of(start + [{"role": "assistant", "content": "dog"}])


def mt_cfg(**kw):
    over = {"pairs_text.strategy": "multiturn", "pairs_text.num_candidates": 3, "pairs_text.num_samples": 2,
            **{f"pairs_text.{k}": v for k, v in kw.items()}}
    return load_params(REPO / "params.yaml", over).pairs_text


def dog_chunk(continuation_moves, window_size, num_candidates=3):
    """One state (the opening of task "dog"), candidates A "dog" (right), B "cat" (wrong), C (no <Answer>)."""
    game = make_game("twenty_questions")
    task = next(t for t in game.tasks("train") if t.task_id == "dog")
    start = game.conversation_start(task)
    rows = [row(0, start + turns(("Is it alive?", "Yes.")))]  # only the opening is a state of it
    cands = iter(["<Answer>Is it a dog?</Answer>", "<Answer>Is it a cat?</Answer>", "I give up"] * 2)
    moves = iter(continuation_moves * 10)
    policy = Scripted(lambda c: next(cands) if len(c) == 2 else f"<Answer>{next(moves)}</Answer>")
    cfg = mt_cfg(window_size=window_size, num_candidates=num_candidates)
    stats = {"states": 0, "continuations": 0, "unparseable_candidates": 0}
    judge = ContinuationJudge(cfg.judge)
    pairs = multiturn_chunk(policy, judge, [(game, task, rows)], cfg, Sampling(), seed=0, max_format_retries=0,
                            stats=stats)
    return pairs, stats, start


def test_multiturn_pairs_on_twenty_questions_by_hand():
    n = len(knowledge_base().members("mammal"))  # 17 mammals: 4.09 bits
    # window 0: each continuation is the candidate and its reply. Both samples agree (the oracle is a program).
    pairs, stats, start = dog_chunk([], window_size=0)
    r_a = (h2(1 / n) + 1) / 2 + 1 - 5e-4 * 4  # guess of 1 in 17, all uncertainty gone, correct; 4 tokens
    r_b = (h2(1 / n) + (1 - math.log2(n - 1) / math.log2(n))) / 2 + 0 - 5e-4 * 4  # 16 left, wrong
    assert len(pairs) == 1
    p = pairs[0]
    assert p["mean_rewards"] == pytest.approx([r_a, r_b, UNPARSEABLE_REWARD])
    assert p["prompt"] == start and p["state_turn"] == 0 and p["candidates"] == 3
    assert p["chosen"] == [{"role": "assistant", "content": "<Answer>Is it a dog?</Answer>"}]
    assert p["rejected"] == [{"role": "assistant", "content": "I give up"}]
    assert (p["chosen_reward"], p["rejected_reward"]) == pytest.approx((r_a, UNPARSEABLE_REWARD))
    assert stats == {"states": 1, "continuations": 4, "unparseable_candidates": 1}  # 2 playable x 2 samples
    # window 1: after "cat" (No.), the policy's next move is "dog" in one sample and "cat" again in the other.
    pairs, stats, _ = dog_chunk(["Is it a dog?", "Is it a cat?"], window_size=1)
    r_b_dog = (((h2(1 / n) + h2(1 / (n - 1))) / 2) + 1) / 2 + 1 - 5e-4 * 8  # found it on the second turn
    r_b_cat = ((h2(1 / n) + 0) / 2 + (1 - math.log2(n - 1) / math.log2(n))) / 2 - 5e-4 * 8  # asked cat twice
    assert pairs[0]["mean_rewards"] == pytest.approx([r_a, (r_b_dog + r_b_cat) / 2, UNPARSEABLE_REWARD])
    assert pairs[0]["chosen"][0]["content"] == "<Answer>Is it a dog?</Answer>"
    # four candidates sampled, the fourth repeats the first: compared once
    pairs, stats, _ = dog_chunk([], window_size=0, num_candidates=4)
    assert pairs[0]["candidates"] == 3 and stats["continuations"] == 4


class FakeJudge(ChatBackend):
    def __init__(self):
        super().__init__("fake-judge")
        self.seen = []

    def generate(self, conversations, sampling):
        self.seen += conversations
        out = []
        for c in conversations:
            text = c[-1]["content"]
            if "Goal reached" in text.split("how the game went on")[-1]:
                out.append("Solved. <interactivity>0.5</interactivity>\n<information_gain>1</information_gain>\n"
                           "<accuracy>correct</accuracy>")
            else:
                out.append("Hmm, no tags at all")
        return [Generation(text=t) for t in out]


def test_llm_judge_scores_the_same_dimensions_and_unreadable_answers_are_dropped():
    from pipeline.text.multiturn_pairs import parse_multiturn_scores

    assert parse_multiturn_scores("<interactivity>0.8</interactivity> <information_gain>.5</information_gain> "
                                  "<accuracy> Very close </accuracy>") == {
        "interactivity": 0.8, "information_gain": 0.5, "accuracy": 0.9}
    assert parse_multiturn_scores("<interactivity>1.5</interactivity><information_gain>0</information_gain>"
                                  "<accuracy>wrong</accuracy>") is None  # outside [0, 1]
    assert parse_multiturn_scores("<interactivity>1</interactivity><information_gain>0</information_gain>"
                                  "<accuracy>almost</accuracy>") is None
    game = make_game("twenty_questions")
    task = next(t for t in game.tasks("train") if t.task_id == "dog")
    start = game.conversation_start(task)
    rows = resume_episodes(Scripted(lambda c: "x"), [
        (game, task, 0, start + [{"role": "assistant", "content": "<Answer>Is it a dog?</Answer>"}]),
        (game, task, 0, start + [{"role": "assistant", "content": "<Answer>Is it a cat?</Answer>"}]),
    ], Sampling(), seed=0, max_new_turns=0)
    fake = FakeJudge()
    judge = ContinuationJudge(LLMConfig(backend="openai", model="judge"), backend=fake)
    scores = judge.score([(game, task, start, r) for r in rows])
    assert scores == [Scores(accuracy=1.0, interactivity=0.5, information_gain=1.0), None]
    assert judge.ledger.unknowns == 1
    asked = fake.seen[0][1]["content"]
    assert 'The secret is: "dog"' in asked and "Player: <Answer>Is it a dog?</Answer>" in asked


def test_multiturn_config_is_validated():
    assert load_params(REPO / "params.yaml").pairs_text.strategy == "paprika"  # the default
    for bad, key in (("pairs_text.strategy=collab", "pairs_text.strategy"),
                     ("pairs_text.num_candidates=1", "pairs_text.num_candidates"),
                     ("pairs_text.judge.model=oracle", "pairs_text"),
                     ("pairs_text.judge.backend=embedding", "pairs_text")):
        with pytest.raises(ConfigError, match=key):
            load_params(REPO / "params.yaml", [bad])


# -- the stage end to end on a tiny model ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def format_model(tmp_path_factory) -> Path:
    """A tiny GPT-2 taught the answer format on a few scripted openings (about half its turns parse)."""
    import torch

    from pipeline.models import tiny
    from stages.bootstrap import scripted_episode

    game = make_game("twenty_questions")
    tasks = game.tasks("train")[:3]
    rng = random.Random(0)
    convs = [scripted_episode(game, tasks[i % 3], rng, 0.3)[:8] for i in range(24)]
    tok = tiny.train_tokenizer([tiny.conversation_text(c) for c in convs], 400)
    model = tiny.build_model(tok, n_layer=1, n_embd=64, n_head=2, n_positions=512, seed=0)
    enc = [tok.apply_chat_template(c, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
           for c in convs]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(40):
        batch = [enc[i] for i in torch.randperm(len(enc), generator=gen)[:8].tolist()]
        width = max(len(e["input_ids"]) for e in batch)
        ids = torch.tensor([e["input_ids"] + [0] * (width - len(e["input_ids"])) for e in batch])
        labels = torch.tensor([[t if m else -100 for t, m in zip(e["input_ids"], e["assistant_masks"], strict=True)]
                               + [-100] * (width - len(e["input_ids"])) for e in batch])
        mask = (ids != 0).long() | (labels != -100).long()
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    out = tmp_path_factory.mktemp("format_model") / "model"
    tiny.save(model.eval(), tok, out)
    return out


def test_multiturn_stage_end_to_end_on_a_tiny_model(format_model, tmp_path):
    from conftest import SMALL

    from pipeline.core.artifacts import read_manifest, read_rows
    from pipeline.core.stage import execute
    from pipeline.models.training import dpo_train

    data = tmp_path / "data"
    shutil.copytree(format_model, data / "bootstrap" / "model")
    params = load_params(REPO / "params.yaml", SMALL + [
        f"data_dir={data}", "tracking.enabled=false", "games.max_train_tasks=3",
        "rollout_text.trajectories_per_task=2", "rollout_text.max_new_tokens=24",
        "rollout_text.max_format_retries=0", "pairs_text.strategy=multiturn", "pairs_text.states_per_task=2",
        "pairs_text.num_candidates=3", "pairs_text.num_samples=2", "pairs_text.window_size=1",
        "pairs_text.tasks_per_chunk=2",
        "train_policy.dpo.init=base"])  # no SFT run here: the reference (and DPO's start) is the bootstrap model
    for stage in ("rollout-text", "annotate-text", "pairs-text"):
        execute(stage, params)
    out = data / "pairs_text" / "preferences"
    pairs = read_rows(out)
    metrics = json.loads((tmp_path / "metrics" / "stages" / "pairs-text.json").read_text())
    assert metrics["strategy"] == "multiturn" and metrics["pairs"] == len(pairs) > 0
    assert read_manifest(out)["num_parts"] == 2  # 3 tasks, 2 per chunk
    for p in pairs:
        assert [m["role"] for m in p["prompt"][:2]] == ["system", "user"] and p["prompt"][-1]["role"] == "user"
        assert sum(m["role"] == "assistant" for m in p["prompt"]) == p["state_turn"]
        assert [m["role"] for m in p["chosen"]] == ["assistant"] == [m["role"] for m in p["rejected"]]
        assert p["chosen"] != p["rejected"] and p["chosen_reward"] > p["rejected_reward"]
        assert p["chosen_reward"] == max(p["mean_rewards"]) and p["rejected_reward"] == min(p["mean_rewards"])
    assert (data / "pairs_text" / "sft" / "_manifest.json").exists()
    # resume: a lost part is recomputed from its own seed, identical
    manifest = read_manifest(out)
    (out / manifest["parts"]["00001"]["file"]).unlink()
    execute("pairs-text", params)
    assert read_manifest(out)["parts"] == manifest["parts"]
    # reflogprobs and DPO consume the pairs unchanged: the completion is the one assistant turn
    execute("reflogprobs", params)
    scored = read_rows(data / "reflogprobs")
    assert len(scored) == len(pairs) and all(r["ref_chosen_logps"] < 0 for r in scored)
    from pipeline.llm.hf import load_policy

    model, tok = load_policy(format_model)
    first = scored[0]
    kept = tok.decode([t for t, m in zip(first["chosen_ids"], first["chosen_mask"], strict=True) if m])
    from pipeline.models.chat import end_of_turn_id

    # the assistant turn's content and the end-of-turn token that stops it (pipeline/models/chat.py)
    assert kept == first["chosen"][0]["content"] + tok.decode([end_of_turn_id(tok)])
    # The policy is the reference: the first DPO loss is log 2 + RPO's mean NLL of the chosen turn (to 1%: TRL
    # trains under bf16 autocast, the stored reference log-probs are float32).
    _, history, _ = dpo_train(model, tok, [first] * 5, tmp_path / "dpo", lr=1e-12, epochs=1, batch_size=1,
                              beta=0.1, rpo_alpha=1.0, warmup_ratio=0.0)
    expected = math.log(2) - first["ref_chosen_logps"] / sum(first["chosen_mask"])
    assert history[0]["loss"] == pytest.approx(expected, rel=1e-2)


def test_exact_scores_read_the_city_knowledge_base_too():
    from pipeline.text.multiturn_pairs import knowledge_base_candidates
    from pipeline.text.multiturn_reward import exact_information_gain

    game = make_game("guess_my_city")
    task = game.tasks("train")[0]
    consistent = knowledge_base_candidates(game, task)
    every = set(game.candidates([]))
    europe = set(game.candidates([("Is it in Europe?", "Yes.")]))
    assert 0 < len(europe) < len(every)
    s = exact_scores(consistent, [], [("Is it in Europe?", "Yes.")], accuracy=0.0)
    assert s.interactivity == pytest.approx(h2(len(europe) / len(every)))
    assert s.information_gain == pytest.approx(exact_information_gain(game.candidates, [], [
        ("Is it in Europe?", "Yes.")]))
    assert s.information_gain == pytest.approx(1 - math.log2(len(europe)) / math.log2(len(every)))
    with pytest.raises(ValueError, match="knowledge base"):
        knowledge_base_candidates(make_game("wordle"), make_game("wordle").tasks("train")[0])


def test_pairs_and_the_sft_set_come_from_the_groups_pairs_text_names(tmp_path):
    """Rollouts of two groups; pairs_text.groups names one: the other's tasks give no pair and no SFT trajectory,
    the metrics say which groups were used; a group the rollouts do not hold is a one-line params error."""
    from pipeline.core.artifacts import read_rows
    from pipeline.core.runners import run_chunked
    from pipeline.core.stage import execute

    data = tmp_path / "data"
    rows = [{**traj(s, ok, t), "group": g, "task_id": f"{g}-0"}
            for g in ("twenty_questions", "bandit") for s, ok, t in ((0, True, 3), (1, False, 20))]
    run_chunked(data / "annotate_text", num_chunks=1, make_chunk=lambda _: rows, params_hash="h")
    base = [f"data_dir={data}", f"metrics_dir={tmp_path / 'metrics'}", "tracking.enabled=false"]

    execute("pairs-text", load_params(REPO / "params.yaml", [*base, "pairs_text.groups=[twenty_questions]"]))
    assert {p["group"] for p in read_rows(data / "pairs_text" / "preferences")} == {"twenty_questions"}
    assert [r["task_id"] for r in read_rows(data / "pairs_text" / "sft")] == ["twenty_questions-0"]
    metrics = json.loads((tmp_path / "metrics" / "stages" / "pairs-text.json").read_text())
    assert metrics["groups"] == "twenty_questions" and metrics["tasks"] == 1

    with pytest.raises(ConfigError, match=r"pairs_text.groups: guess_my_city not in the annotated rollouts "
                                          r"\(they hold bandit, twenty_questions\)"):
        execute("pairs-text", load_params(REPO / "params.yaml", [*base, "pairs_text.groups=[guess_my_city]"]))


def test_the_exact_judge_scores_knowledge_base_games_at_any_tier():
    """Tiered groups (``twenty_questions@shown4``) have the knowledge base their game has; bandit has none and is
    named in the one-line refusal."""
    from stages.pairs_text import check_exact_judge

    check_exact_judge([make_game("twenty_questions@shown4"), make_game("guess_my_city@shown4"),
                       make_game("twenty_questions")])
    with pytest.raises(ConfigError, match="the rollouts also hold bandit@easy3: use an LLM judge"):
        check_exact_judge([make_game("twenty_questions@shown4"), make_game("bandit@easy3")])
