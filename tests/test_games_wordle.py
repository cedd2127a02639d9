import random

import pytest

from pipeline.envs.base import Task, make_game
from pipeline.envs.wordle import WORDS, feedback


@pytest.mark.parametrize(
    ("secret", "guess", "marks"),
    [
        # b,e are green at 3,4; the unmatched secret letters a,b,y make the first b and the a yellow; s is grey.
        ("abbey", "babes", "YYGGX"),
        # p green at 3; unmatched a,p,l,e: the first p, the a and the e yellow; r grey.
        ("apple", "paper", "YYGYX"),
        # The secret's only e is matched green at 5, so neither earlier e may be yellow.
        ("crane", "eerie", "XXYXG"),
        # Green e at 3; one e left in the secret: the e at 2 is yellow, the e at 5 grey; s yellow.
        ("speed", "geese", "XYGYX"),
        # Two l's in the secret, two in the guess, none in place: both yellow.
        ("llama", "hello", "XXYYX"),
        # One l in the secret and two in the guess: only the first (leftmost) gets the yellow.
        ("plant", "hello", "XXYXX"),
        ("apple", "apple", "GGGGG"),
    ],
)
def test_feedback_marks_repeated_letters_at_most_as_often_as_the_secret_has_them(secret, guess, marks):
    assert feedback(secret, guess) == marks


def _task(secret: str) -> Task:
    return Task("wordle", "t", secret, "secret five-letter word")


def test_invalid_guesses_get_a_message_and_cost_a_turn():
    game = make_game("wordle")
    state = game.reset(_task("apple"), random.Random(0))
    too_short = game.step(state, "app")
    unknown = game.step(state, "zzzzz")
    assert "five-letter" in too_short.reply and "not in the word list" in unknown.reply
    assert too_short.info["invalid"] and unknown.info["invalid"] and not unknown.done
    assert state.turns == 2
    assert game.step(state, "paper").reply == "paper: YYGYX"
    solved = game.step(state, "APPLE")
    assert solved.success and solved.done and "Goal reached" in solved.reply


def test_six_wrong_guesses_end_the_game_as_a_failure():
    game = make_game("wordle")
    state = game.reset(_task("apple"), random.Random(0))
    results = [game.step(state, w) for w in ["house", "paper", "slate", "trace", "crane", "hello"]]
    assert [r.done for r in results] == [False] * 5 + [True]
    assert not results[-1].success
    assert game.step(state, "apple").done  # nothing changes after the end
    assert not state.success


def test_word_list_and_splits():
    game = make_game("wordle")
    assert len(WORDS) >= 1000 and len(set(WORDS)) == len(WORDS)
    assert all(len(w) == 5 and w.isalpha() and w.islower() for w in WORDS)
    train, held_out = game.tasks("train"), game.tasks("eval")
    assert {t.env for t in train}.isdisjoint(t.env for t in held_out)
    assert game.is_correct_guess(train[0], train[0].env.upper())
