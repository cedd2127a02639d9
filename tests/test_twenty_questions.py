"""Twenty questions: the knowledge base, the oracle, the fixed split and the scripted questioner."""

from __future__ import annotations

import importlib.util
import itertools
import json
import random
import statistics
from collections import Counter

import pytest

from pipeline.envs.base import make_game
from pipeline.envs.gamekit import DATA_DIR
from pipeline.envs.twenty_questions import KB_FILE, knowledge_base, oracle_reply


@pytest.fixture(scope="module")
def kb():
    return knowledge_base()


@pytest.fixture(scope="module")
def game():
    return make_game("twenty_questions")


def play(game, task, policy) -> tuple[bool, int, list[tuple[str, str]]]:
    """One episode: ``policy(history)`` gives each action; returns (success, turns, history)."""
    state = game.reset(task, random.Random(0))
    history: list[tuple[str, str]] = []
    while True:
        action = policy(history)
        result = game.step(state, action)
        history.append((action, result.reply))
        if result.done:
            return result.success, state.turns, history


# -- knowledge base -----------------------------------------------------------------------------------------------
def test_knowledge_base_size_and_completeness(kb):
    data = json.loads((DATA_DIR / KB_FILE).read_text())
    assert len(kb.objects) >= 150 and len(kb.categories) >= 10
    assert len(kb.attributes) >= 45
    assert all(len(kb.members(c)) >= 12 for c in kb.categories)
    for obj in data["objects"]:
        # explicit booleans, not defaults: every object carries every attribute
        assert set(obj["attributes"]) == set(kb.attributes), obj["name"]
        assert all(isinstance(v, bool) for v in obj["attributes"].values())
        assert obj["name"] == obj["name"].lower() and 1 <= len(obj["name"].split()) <= 2
    for attr in data["attributes"]:
        assert attr["question"].endswith("?") and 1 <= len(attr["paraphrases"]) <= 4 and attr["keywords"]


def test_every_pair_in_a_category_is_distinguishable(kb):
    for category in kb.categories:
        for a, b in itertools.combinations(kb.members(category), 2):
            assert any(kb.value(a, x) != kb.value(b, x) for x in kb.attributes), (category, a, b)


def test_attributes_split_within_categories(kb):
    splitting = [
        x for x in kb.attributes if any(0 < kb.split_quality(kb.members(c), x) for c in kb.categories)
    ]
    assert len(splitting) >= 0.8 * len(kb.attributes)


def test_json_is_what_the_builder_writes():
    path = DATA_DIR / "build_twenty_questions.py"
    spec = importlib.util.spec_from_file_location("build_twenty_questions", path)
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    assert builder.render(builder.build()) == (DATA_DIR / KB_FILE).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("obj", "attr", "expected"),
    [
        ("dog", "alive", True), ("whale", "mammal", True), ("whale", "fish", False), ("penguin", "flies", False),
        ("bat", "flies", True), ("banana", "yellow", True), ("lemon", "sweet", False), ("potato", "raw", False),
        ("car", "wheels", True), ("bicycle", "engine", False), ("table", "legs", True),
        ("airplane", "wings", True), ("tennis racket", "strings", True), ("refrigerator", "electric", True),
        ("mushroom", "plant_part", False), ("smartphone", "pocket", True), ("elephant", "bigger_car", True),
        ("coconut", "tree", True),
    ],
)
def test_spot_checked_facts(kb, obj, attr, expected):
    assert kb.value(obj, attr) is expected


# -- reading questions --------------------------------------------------------------------------------------------
def test_canonical_questions_paraphrases_and_guesses_read_back(kb):
    data = json.loads((DATA_DIR / KB_FILE).read_text())
    for attr in data["attributes"]:
        for phrase in [attr["question"], *attr["paraphrases"]]:
            assert kb.match_question(phrase) == attr["id"], phrase
    for obj in kb.objects:
        assert kb.match_object(kb.guess(obj)) == obj
        for synonym in kb.synonyms[obj]:
            assert kb.match_object(f"Is it a {synonym}?") == obj


@pytest.mark.parametrize(
    ("text", "attr"),
    [
        ("IS IT ALIVE", "alive"), ("is it alive???", "alive"), ("alive?", "alive"), ("Does it fly?", "flies"),
        ("Okay, so can it fly?", "flies"), ("Is it man made?", "manmade"),
        ("Is the object made of metal?", "metal"), ("Does it have 4 legs?", "four_legs"),
        ("Is it a kind of fish?", "fish"), ("Is it red or not?", "red"), ("Is it orange?", "orange"),
        ("Is it bigger than a car?", "bigger_car"), ("Would it fit in a pocket?", "pocket"),
        ("Is it something you would find on a farm?", "farm"),
    ],
)
def test_question_variants_map_to_attributes(kb, text, attr):
    assert kb.match_question(text) == attr
    assert kb.match_object(text) is None


@pytest.mark.parametrize(
    ("text", "obj"),
    [("Is it a dog?", "dog"), ("dog", "dog"), ("Is it an automobile?", "car"), ("It's a fridge!", "refrigerator"),
     ("Is it an orange?", "orange"), ("Is it the sea turtle?", "sea turtle"), ("Is it peaches?", "peach")],
)
def test_guesses_map_to_objects(kb, text, obj):
    assert kb.match_object(text) == obj
    assert kb.match_question(text) is None


# -- the oracle and the game --------------------------------------------------------------------------------------
def test_oracle_answers(kb):
    assert oracle_reply("dog", "Is it alive?") == "Yes."
    assert oracle_reply("dog", "Can it fly?") == "No."
    assert oracle_reply("dog", "is it a PUPPY") == "Goal reached"
    assert oracle_reply("car", "Is it an automobile?") == "Goal reached"
    assert oracle_reply("car", "Is it a bus?") == "No."
    assert oracle_reply("car", "Is it a hamster?") == "Sorry, I cannot answer this question."
    assert oracle_reply("car", "What is the meaning of life?") == "Sorry, I cannot answer this question."
    assert oracle_reply("orange", "Is it orange?") == "Yes."
    assert oracle_reply("banana", "Is it orange?") == "No."


def test_episode_success_and_turn_limit(game):
    task = next(t for t in game.tasks("train") + game.tasks("eval") if t.env == "car")
    state = game.reset(task, random.Random(0))
    result = game.step(state, "Does it have wheels?")
    assert (result.reply, result.done, result.success) == ("Yes.", False, False)
    result = game.step(state, "Is it an automobile?")
    assert (result.reply, result.done, result.success) == ("Goal reached", True, True)
    assert state.turns == 2 and game.is_correct_guess(task, "car") and not game.is_correct_guess(task, "bus")

    success, turns, history = play(game, task, lambda h: "Is it purple?")
    assert (success, turns, len(history)) == (False, 20, 20)
    assert game.step(game.reset(task, random.Random(0)), "blah").info["unanswerable"]


def test_split_is_fixed_disjoint_and_covers_every_category(game, kb):
    train, evaluation = game.tasks("train"), game.tasks("eval")
    assert [t.task_id for t in train] == [t.task_id for t in make_game("twenty_questions").tasks("train")]
    assert not {t.env for t in train} & {t.env for t in evaluation}
    assert {t.env for t in train} | {t.env for t in evaluation} == set(kb.objects)
    assert {t.agent for t in train} == {t.agent for t in evaluation} == set(kb.categories)
    assert 0.2 <= len(evaluation) / len(kb.objects) <= 0.3
    assert {t.difficulty for t in train + evaluation} == {"easy", "medium", "hard"}
    assert all(t.group == "twenty_questions" and t.task_id == t.env for t in train + evaluation)


def test_prompts_are_short(game):
    task = game.tasks("eval")[0]
    start = game.conversation_start(task)
    article = "an" if task.agent[0] in "aeiou" else "a"
    assert start[1]["content"] == f"You are trying to guess {article} {task.agent}. Ask your first question!"
    assert "<Answer>" in start[0]["content"] and len(start[0]["content"].split()) <= 45


def test_consistent_narrows_candidates(kb):
    history = [("Can it fly?", "Yes."), ("Is it a parrot?", "No."), ("Is it a pet?", "Yes."), ("blah", "Sorry")]
    assert kb.consistent("bird", history) == []  # the only flying pet bird was ruled out
    history = [("Does it have hooves?", "Yes."), ("Does it have stripes?", "No."), ("Is it a horse?", "No.")]
    expected = [o for o in kb.members("mammal") if kb.value(o, "hooves") and not kb.value(o, "stripes")]
    assert kb.consistent("mammal", history) == [o for o in expected if o != "horse"]
    assert kb.consistent("mammal", [("Is it a cow?", "Goal reached")]) == ["cow"]


# -- scripted questioner ------------------------------------------------------------------------------------------
def test_noise_free_scripted_player_always_wins_quickly(game):
    rng = random.Random(1)
    turns = []
    for task in game.tasks("train") + game.tasks("eval"):
        success, n, _ = play(game, task, lambda h, t=task: game.scripted_action(t, h, rng, noise=0.0))
        assert success and n <= 20, task
        turns.append(n)
    print(f"noise-free scripted player: mean {statistics.mean(turns):.2f} turns, max {max(turns)}")
    assert statistics.mean(turns) <= 6


def test_comparison_yardstick_alone_is_not_the_comparison():
    # "Is it a breadbox?" names a thing; it must not be read as "Is it bigger than a breadbox?".
    assert oracle_reply("dog", "Is it bigger than a breadbox?") == "Yes."
    assert oracle_reply("dog", "Is it a breadbox?") == "Sorry, I cannot answer this question."
    assert oracle_reply("dog", "Is it smaller than a breadbox?") == "Sorry, I cannot answer this question."


def test_scripted_player_asks_canonical_questions_and_noise_makes_poor_moves(game, kb):
    task = next(t for t in game.tasks("train") if t.agent == "mammal")
    canonical = {kb.question(a) for a in kb.attributes}
    rng = random.Random(2)
    first = game.scripted_action(task, [], rng, noise=0.0)
    assert first in canonical and kb.split_quality(kb.members("mammal"), kb.match_question(first)) > 0.9
    history = [("Does it have hooves?", oracle_reply(task.env, "Does it have hooves?"))]
    ruled_out = set(kb.members("mammal")) - set(kb.consistent("mammal", history))
    moves = Counter()
    for _ in range(400):
        action = game.scripted_action(task, history, rng, noise=1.0)
        if kb.match_object(action):
            kind = "guess"
            assert kb.match_object(action) in ruled_out
        elif action in canonical:
            kind = "question"
        else:
            kind = "unreadable"
            assert oracle_reply(task.env, action) == kb.prompts["unknown"]
        moves[kind] += 1
    # 35% ruled-out guesses, 15% unreadable questions, 50% random canonical questions.
    assert 100 < moves["guess"] < 180 and 30 < moves["unreadable"] < 90 and 160 < moves["question"] < 240
