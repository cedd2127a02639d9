"""Difficulty tiers (GAME@TIER): game params that change the task, checked, with the untiered games unchanged."""

from __future__ import annotations

import random

import pytest

from pipeline.core.config import ConfigError
from pipeline.envs.base import game_class, make_game, parse_tier
from pipeline.envs.gamekit import shown_candidates
from pipeline.envs.twenty_questions import knowledge_base
from pipeline.params import load_params


def opening(game, task) -> str:
    return game.conversation_start(task)[1]["content"]


@pytest.mark.parametrize("group", ["twenty_questions@shown4", "guess_my_city@shown6"])
def test_shown_tier_lists_the_secret_among_its_candidates_and_caps_the_turns(group):
    game = make_game(group)
    n, turns = game.tier["candidates"], game.tier["max_turns"]
    assert game.name == group and game.max_turns == turns < n
    for task in game.tasks("train")[:20] + game.tasks("eval")[:20]:
        shown = game.shown(task)
        assert len(shown) == len(set(shown)) == n and task.env in shown and task.group == group
        text = opening(game, task)
        assert all(c in text for c in shown) and f"{turns} turns" in text
    # the secret's place in the list varies: the list does not give it away
    places = {game.shown(t).index(t.env) for t in game.tasks("train")[:40]}
    assert len(places) > 1


@pytest.mark.parametrize("group", ["twenty_questions@shown4", "guess_my_city@shown4"])
def test_listing_every_candidate_cannot_win_a_shown_tier(group):
    game = make_game(group)
    for task in game.tasks("eval")[:10]:
        shown = game.shown(task)
        last = shown.index(task.env) == len(shown) - 1
        order = shown if last else [c for c in shown if c != task.env] + [task.env]  # the secret named last
        state, result = game.reset(task, random.Random(0)), None
        for name in order:
            result = game.step(state, f"Is it {name}?")
            if result.done:
                break
        assert result.done and not result.success and state.turns == game.max_turns


def test_naming_the_secret_wins_a_shown_tier_and_the_scripted_player_stays_inside_the_list():
    game = make_game("twenty_questions@shown10")
    wins = 0
    for task in game.tasks("train")[:30]:
        state, history = game.reset(task, random.Random(0)), []
        rng = random.Random(1)
        while not state.done:
            action = game.scripted_action(task, history, rng, noise=0.0)
            result = game.step(state, action)
            history.append((action, result.reply))
        wins += state.success
        guessed = {knowledge_base().match_object(q) for q, _ in history} - {None}
        assert guessed and guessed <= set(game.shown(task))
    assert wins >= 25  # 10 candidates, 5 turns: the yes/no questions find nearly every secret


def test_turn_limit_at_or_above_the_candidates_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"max_turns must be an integer in 1\.\.3 \(below candidates=4"):
        make_game("twenty_questions@candidates=4,max_turns=4")
    with pytest.raises(ValueError, match="no tier 'hardest'"):
        make_game("guess_my_city@hardest")
    with pytest.raises(ValueError, match="mastermind has no difficulty tiers"):
        make_game("mastermind@shown4")
    with pytest.raises(ValueError, match="one best arm"):
        make_game("bandit@means=0.5/0.5,budget=3")
    with pytest.raises(ConfigError, match=r"games.groups: 'twenty_questions@candidates=3,max_turns=3'"):
        load_params("params.yaml", ['games.groups=["twenty_questions@candidates=3,max_turns=3"]'])
    assert parse_tier(game_class("twenty_questions"), "candidates=5,max_turns=2") == {"candidates": 5, "max_turns": 2}


def test_the_task_changes_with_the_tier_and_the_untiered_game_is_unchanged():
    plain, tiered = make_game("twenty_questions"), make_game("twenty_questions@shown4")
    task = plain.tasks("eval")[0]
    assert plain.tier == {} and plain.max_turns == 20 and plain.name == "twenty_questions"
    # the same held-out secrets (a tier never moves a secret between splits), but another task group and opening
    assert [t.env for t in tiered.tasks("eval")] == [t.env for t in plain.tasks("eval")]
    assert opening(plain, task) == "You are trying to guess " + (
        f"{'an' if task.agent[0] in 'aeiou' else 'a'} {task.agent}. Ask your first question!")
    tiered_task = tiered.tasks("eval")[0]
    assert opening(tiered, tiered_task) != opening(plain, task) and tiered_task.group != task.group
    city, city4 = make_game("guess_my_city"), make_game("guess_my_city@shown4")
    assert [t.env for t in city4.tasks("eval")] == [t.env for t in city.tasks("eval")]
    assert city.max_turns == 20 and "one of these" not in opening(city, city.tasks("eval")[0])
    bandit = make_game("bandit")
    assert bandit.budget == 20 and {len(t.env["means"]) for t in bandit.tasks("train")} == {2, 3, 4}


def test_bandit_easy_tier_is_paprikas_config_with_the_best_arm_moving():
    game = make_game("bandit@easy3")
    assert game.budget == 4 and game.max_turns == 5 and "4 pulls" in game.system_prompt(game.tasks("train")[0])
    tasks = game.tasks("train")
    assert all(sorted(t.env["means"]) == [0.4, 0.4, 0.6] for t in tasks)
    best = [game.best_arm(t) for t in tasks]
    assert {b: best.count(b) / len(best) for b in "ABC"} == pytest.approx({b: 1 / 3 for b in "ABC"}, abs=0.1)
    state = game.reset(tasks[0], random.Random(0))
    for _ in range(4):
        assert not game.step(state, "A").done
    assert game.step(state, game.best_arm(tasks[0])).success


def test_shown_candidates_is_a_pure_function_of_its_key():
    pool = [f"c{i}" for i in range(12)]
    a = shown_candidates("c3", pool, 5, "k")
    assert a == shown_candidates("c3", pool, 5, "k") and len(a) == 5 and "c3" in a
    assert any(shown_candidates("c3", pool, 5, key) != a for key in ("k2", "k3", "k4"))


def test_a_tiered_groups_metrics_are_valid_mlflow_names():
    from mlflow.utils.validation import _validate_metric_name

    from pipeline.core.tracking import Tracker

    sent = []
    Tracker(lambda name, args: sent.append(args)).log_metrics(
        {"base/twenty_questions@shown4/success_rate": 0.5, "rl/bandit@means=0.8/0.2,budget=2/mean_turns": 3,
         "dpo/success_rate": 0.25})
    [[metrics, _]] = sent
    assert metrics == {"base_twenty_questions:shown4_success_rate": 0.5,
                       "rl_bandit:means:0.8_0.2:budget:2_mean_turns": 3.0, "dpo_success_rate": 0.25}
    for name in metrics:
        _validate_metric_name(name)  # raises on a name MLflow refuses


EVERY_GROUP = ["twenty_questions", "guess_my_city", "wordle", "mastermind", "battleship", "minesweeper",
               "cellular_automata", "bandit", "customer_service", "murder_mystery", "twenty_questions@shown4",
               "twenty_questions@shown10", "guess_my_city@shown4", "guess_my_city@shown10", "bandit@easy3",
               "bandit@easy2"]


def test_held_out_secrets_are_never_train_or_val_secrets_unless_declared_fresh_draws():
    """Every group's held-out tasks (their secrets, ``task.env``) are disjoint from its train and val tasks; only a
    group that declares its held-out tasks fresh draws of the train configurations (the bandit tiers, whose tasks
    all shuffle the same arm means) repeats them, and then every held-out task is such a repeat."""
    import json

    from pipeline.text.policies import game_tasks, make_games

    params = load_params("params.yaml", [f"games.groups={json.dumps(EVERY_GROUP)}", "games.val_fraction=0.2"])
    for game in make_games(params):
        secrets = {s: {json.dumps(t.env, sort_keys=True) for t in game_tasks(params.games, game, s, cap=0)}
                   for s in ("train", "val", "eval")}
        assert secrets["eval"] and secrets["val"], game.name
        if game.held_out_fresh_draws:
            assert game.name.startswith("bandit@") and secrets["eval"] <= secrets["train"] | secrets["val"]
        else:
            assert not secrets["eval"] & (secrets["train"] | secrets["val"]), game.name
