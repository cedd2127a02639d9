"""Prompt templates fill in, and their parsers accept exactly what they should."""

import pytest

from pipeline.envs.llm_host import environment_messages, parse_environment_reply
from pipeline.nethack.annotation import (
    RETRY_PROMPT,
    message_label_messages,
    parse_message_label,
    parse_preference,
    preference_goals,
    preference_messages,
    preference_templates,
)
from pipeline.text.judge import judge_messages, parse_verdict


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Yes", "Yes"),
        ("yes.", "Yes"),
        ("  NO ", "No"),
        ("**Yes**", "Yes"),
        ('"No."', "No"),
        ("Goal reached", "Goal reached"),
        ("goal  reached!", "Goal reached"),
        ("GOAL REACHED.", "Goal reached"),
        ("Yes, it is.", None),
        ("No idea", None),
        ("Yes No", None),
        ("", None),
        ("Goal", None),
        ("I think yes", None),
        ("Goal reached? No.", None),
    ],
)
def test_environment_reply_is_strict(text, expected):
    assert parse_environment_reply(text) == expected


def test_environment_prompt_carries_secret_history_and_city_rule():
    conv = environment_messages("Paris", "city", [("Is it in Europe?", "Yes")], "Is it Paris?")
    assert [m["role"] for m in conv] == ["system", "user"]
    assert "Paris" in conv[0]["content"] and "country" in conv[0]["content"]
    assert "1. Is it in Europe? -> Yes" in conv[1]["content"] and conv[1]["content"].count("Is it Paris?") == 1
    animal = environment_messages("cat", "animal", [], "Is it alive?")
    assert "country" not in animal[0]["content"] and "(none yet)" in animal[1]["content"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("It matches.\n<VALID>", "VALID"),
        ("<NOTVALID>", "NOTVALID"),
        ("<not valid>", "NOTVALID"),
        ("First I thought <VALID> but no.\n<NOTVALID>", "NOTVALID"),
        ("valid", None),
        ("VALID", None),
        ("", None),
    ],
)
def test_verdict_takes_the_last_tag(text, expected):
    assert parse_verdict(text) == expected


def test_judge_prompt_has_transcript_without_system_turns():
    conv = [
        {"role": "system", "content": "RULES"},
        {"role": "user", "content": "Guess an animal."},
        {"role": "assistant", "content": "<Answer>Is it a cat?</Answer>"},
        {"role": "user", "content": "Goal reached"},
    ]
    msgs = judge_messages("cat", "animal", conv, "Is it a cat?", True)
    assert "RULES" not in msgs[1]["content"]
    assert (
        "Player: <Answer>Is it a cat?</Answer>" in msgs[1]["content"]
        and "Host: Goal reached" in msgs[1]["content"]
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('Analysis...\n("best_description": 1)', "FIRST"),
        ('("best_description": 2)', "SECOND"),
        ('("best_description": None)', "TIE"),
        ('("BEST_DESCRIPTION": none)', "TIE"),
        ("{'best_description': 2}", "SECOND"),
        ('I first said ("best_description": 1) but the answer is ("best_description": 2)', "SECOND"),
        ("Description 1 is best.", "UNKNOWN"),
        ('("best_description": 3)', "UNKNOWN"),
        ("", "UNKNOWN"),
    ],
)
def test_preference_parser(text, expected):
    assert parse_preference(text) == expected


@pytest.mark.parametrize("goal", ["defaultgoal", "zeroknowledge", "combat", "gold", "stairs"])
@pytest.mark.parametrize("template", ["default", "reworded"])
def test_preference_prompt_variants(goal, template):
    conv = preference_messages("You kill the newt!", "You see here 3 gold pieces.", goal, template)
    user = conv[1]["content"]
    assert "Description 1:\nYou kill the newt!" in user and "Description 2:\nYou see here 3 gold pieces." in user
    assert '("best_description": None)' in user and "{" not in user


def test_preference_variant_lists_and_errors():
    assert preference_goals() == ["defaultgoal", "zeroknowledge", "combat", "gold", "stairs"]
    assert preference_templates() == ["default", "reworded"]
    assert "best_description" in RETRY_PROMPT
    with pytest.raises(ValueError, match="unknown goal 'speed'"):
        preference_messages("a", "b", "speed")
    with pytest.raises(ValueError, match="unknown preference template"):
        preference_messages("a", "b", "gold", "poem")
    assert "(no message)" in preference_messages("", "b")[1]["content"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("It finds gold.\n<label>helpful</label>", "helpful"),
        ("<label> Unhelpful </label>.", "unhelpful"),
        ("Helpful? Maybe.\n<label>unhelpful</label>\n", "unhelpful"),
        ("This message is helpful.", "UNKNOWN"),  # a label word in the reasoning does not count
        ("<label>helpful</label> but actually it is not", "UNKNOWN"),  # the tag must close the answer
        ("label: helpful", "UNKNOWN"),
        ("<label>useful</label>", "UNKNOWN"),
    ],
)
def test_message_label_parser_is_strict(text, expected):
    assert parse_message_label(text) == expected


def test_message_label_prompt():
    conv = message_label_messages("You find a hidden passage.", goal="stairs")
    assert '"You find a hidden passage."' in conv[1]["content"] and "<label>helpful</label>" in conv[1]["content"]
