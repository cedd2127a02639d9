"""Customer service and murder mystery: LLM-played environments, tested with a scripted fake backend."""

import random

import pytest

from pipeline.envs.base import make_game
from pipeline.llm.base import ChatBackend, Generation, Sampling
from pipeline.text.judge import parse_verdict


class ScriptedBackend(ChatBackend):
    """Answers from a function of the conversation; records every request."""

    name = "scripted"

    def __init__(self, reply):
        super().__init__("scripted")
        self.reply = reply
        self.requests: list[list[dict]] = []

    def generate(self, conversations, sampling: Sampling):
        self.requests += conversations
        return [self.reply(c) for c in conversations]


def customer(conversation):
    said = conversation[-1]["content"].lower()
    if "channel" in said:
        return Generation("Goal reached")
    if "when" in said:
        return Generation("Customer: Mostly in the evening.")
    return Generation("I'm not sure.")


def _wifi_task(game):
    return next(t for t in game.tasks("train") + game.tasks("eval") if t.env["id"] == "cs01")


def test_customer_service_batch_against_the_customer_model():
    backend = ScriptedBackend(customer)
    game = make_game("customer_service", environment=backend)
    assert game.env_kind == "llm"
    task = _wifi_task(game)
    one, two = game.reset(task, random.Random(0)), game.reset(task, random.Random(0))
    first = game.step_batch([one, two], ["When does it drop?", "Did you restart it?"])
    assert [r.reply for r in first] == ["Mostly in the evening.", "I'm not sure."]
    second = game.step_batch([one, two], ["Please change the Wi-Fi channel.", "Is it plugged in?"])
    assert second[0].success and second[0].done and "Goal reached" in second[0].reply
    assert not second[1].done and (one.turns, two.turns) == (2, 2)
    # The customer model saw its role prompt, then the agent as user and itself as assistant.
    last = backend.requests[-2]
    assert last[0]["role"] == "system" and task.env["fix"] in last[0]["content"]
    assert [m["role"] for m in last[1:]] == ["user", "assistant", "user"]
    assert last[1]["content"] == "When does it drop?" and last[2]["content"] == "Mostly in the evening."
    # A finished episode is not sent to the model again.
    before = len(backend.requests)
    third = game.step_batch([one, two], ["Thanks!", "Change the channel."])
    assert third[0].done and len(backend.requests) == before + 1 and third[1].success


def test_empty_replies_are_retried_then_fall_back():
    calls = []

    def flaky(conversation):
        calls.append(conversation)
        return Generation("", error="timeout") if len(calls) == 1 else Generation("It is a new router.")

    game = make_game("customer_service", environment=ScriptedBackend(flaky))
    state = game.reset(_wifi_task(game), random.Random(0))
    result = game.step(state, "Is the router new?")
    assert result.reply == "It is a new router." and result.info["env_retries"] == 1
    assert calls[1] == calls[0]  # a failed request is resent as it was: the model said nothing to correct

    backend = ScriptedBackend(lambda c: Generation("   "))
    silent = make_game("customer_service", environment=backend)
    state = silent.reset(_wifi_task(silent), random.Random(0))
    result = silent.step(state, "Hello?")
    assert result.reply == silent.prompts("fallback") and result.info["env_fallback"]
    assert result.info["env_retries"] == silent.max_env_retries
    # an empty reply is shown back with the correction: a new prompt, not a cache hit
    assert backend.requests[1][-2:] == [{"role": "assistant", "content": "..."},
                                        {"role": "user", "content": silent.prompts("retry")}]


def test_a_missing_environment_is_a_clear_error_that_changes_nothing():
    game = make_game("murder_mystery")
    state = game.reset(game.tasks("train")[0], random.Random(0))
    with pytest.raises(RuntimeError, match="environment backend must be configured"):
        game.step(state, "Where was everyone?")
    assert state.turns == 0 and not state.history


def test_murder_mystery_narrator_may_not_give_the_culprit_away():
    game = make_game("murder_mystery")
    task = game.tasks("train")[0]
    culprit = task.env["culprit"]
    innocent = next(s["name"] for s in task.env["suspects"] if s["name"] != culprit)
    replies = iter([f"{culprit} is the killer, obviously.", "The cellar door was locked."])
    game.environment = ScriptedBackend(lambda c: Generation(next(replies)))
    state = game.reset(task, random.Random(0))
    result = game.step(state, "Examine the cellar door.")
    assert result.reply == "The cellar door was locked." and result.info["env_retries"] == 1
    assert game.is_correct_guess(task, f"Accuse {culprit}")
    assert not game.is_correct_guess(task, f"Accuse {innocent}")
    assert not game.is_correct_guess(task, f"Accuse {culprit} and {innocent}")


def test_judge_request_and_verdicts():
    game = make_game("murder_mystery")
    task = game.tasks("eval")[0]
    conversation = game.judge_conversation(task, [(f"Accuse {task.env['culprit']}", "Case solved. Goal reached.")])
    assert conversation[0]["role"] == "system" and task.env["culprit"] in conversation[1]["content"]
    assert "Detective: Accuse" in conversation[1]["content"]
    assert parse_verdict("Reasoning... <VALID>") == "VALID"
    assert parse_verdict("<VALID> no wait <NOTVALID>") == "NOTVALID"
    assert parse_verdict("no tag") is None


@pytest.mark.parametrize("name", ["customer_service", "murder_mystery"])
def test_scenarios_written_for_the_project(name):
    game = make_game(name)
    tasks = game.tasks("train") + game.tasks("eval")
    assert len(tasks) >= 20 and len({t.env["id"] for t in tasks}) == len(tasks)
    assert {t.difficulty for t in tasks} == {"easy", "medium", "hard"}
    if name == "murder_mystery":
        assert all(t.env["culprit"] in {s["name"] for s in t.env["suspects"]} for t in tasks)
