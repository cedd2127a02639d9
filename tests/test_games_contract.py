"""What every game of the text track owes the rollout stage, checked on each one."""

import copy
import json
import random

import pytest

from pipeline.envs.base import extract_answer, format_answer, make_game

PROGRAM_GAMES = ["wordle", "mastermind", "battleship", "minesweeper", "cellular_automata", "bandit",
                 "guess_my_city"]
LLM_GAMES = ["customer_service", "murder_mystery"]
MAX_TURNS = {"wordle": 6, "cellular_automata": 6, "mastermind": 12, "battleship": 20, "minesweeper": 20,
             "bandit": 21, "guess_my_city": 20, "customer_service": 20, "murder_mystery": 20}
# Lowest acceptable win rate of the noiseless scripted player (measured rates are in the module docs/report).
SCRIPTED_WIN_RATE = {"wordle": 0.95, "mastermind": 0.95, "battleship": 0.75, "minesweeper": 0.75,
                     "cellular_automata": 0.95, "bandit": 0.8, "guess_my_city": 0.95}


@pytest.fixture(scope="module", params=PROGRAM_GAMES + LLM_GAMES)
def game(request):
    return make_game(request.param)


def test_turn_limits_and_kinds(game):
    assert game.max_turns == MAX_TURNS[game.name]
    assert game.env_kind == ("llm" if game.name in LLM_GAMES else "program")


def test_tasks_are_fixed_labelled_and_storable(game):
    train, held_out = game.tasks("train"), game.tasks("eval")
    assert 15 <= len(train) <= 1500 and 5 <= len(held_out) <= 500
    again = make_game(game.name)
    assert again.tasks("train") == train and again.tasks("eval") == held_out  # fixed, not re-sampled
    ids = [t.task_id for t in train + held_out]
    assert len(set(ids)) == len(ids)
    assert {t.split for t in train} == {"train"} and {t.split for t in held_out} == {"eval"}
    assert {t.difficulty for t in train} == {"easy", "medium", "hard"}
    json.dumps([t.to_row() for t in train[:50]])  # rows must be storable as they are


def test_prompts_are_short_and_name_the_answer_format(game):
    task = game.tasks("train")[0]
    system = game.system_prompt(task)
    assert "<Answer>" in system and len(system) < 450
    assert system.count(". ") + 1 <= 4  # a few sentences for a ~768-token model
    assert len(game.first_message(task)) < 400
    assert extract_answer(format_answer("B3")) == "B3"


@pytest.mark.parametrize("name", PROGRAM_GAMES)
def test_episodes_end_at_max_turns_and_states_copy(name):
    game = make_game(name)
    task = game.tasks("eval")[0]
    state = game.reset(task, random.Random(0))
    snapshot = copy.deepcopy(state)
    results = [game.step(state, "???") for _ in range(game.max_turns)]
    assert [r.done for r in results] == [False] * (game.max_turns - 1) + [True]
    assert not results[-1].success and game.step(state, "???").done
    assert snapshot.turns == 0  # the copy did not move with the original


@pytest.mark.parametrize("name", PROGRAM_GAMES)
def test_scripted_player_wins_most_tasks_without_noise(name):
    game = make_game(name)
    rng = random.Random(1)
    tasks = rng.sample(game.tasks("train"), 40)
    wins = 0
    for task in tasks:
        state, history = game.reset(task, rng), []
        for _ in range(game.max_turns):
            action = game.scripted_action(task, history, rng, noise=0.0)
            assert action and len(action) <= 60 and "\n" not in action
            result = game.step(state, action)
            history.append((action, result.reply))
            if result.done:
                break
        wins += result.success
    assert wins / len(tasks) >= SCRIPTED_WIN_RATE[name]


@pytest.mark.parametrize("name", PROGRAM_GAMES)
def test_noise_makes_the_scripted_player_worse(name):
    game = make_game(name)
    rng = random.Random(2)
    tasks = rng.sample(game.tasks("train"), 30)

    def score(noise: float) -> float:
        total = 0.0
        for task in tasks:
            state, history = game.reset(task, rng), []
            for _ in range(game.max_turns):
                action = game.scripted_action(task, history, rng, noise)
                result = game.step(state, action)
                history.append((action, result.reply))
                if result.done:
                    break
            total += result.success - 0.01 * state.turns
        return total

    assert score(1.0) < score(0.0)
