"""The roles built on the backends: LLM environment, judges, Motif preferences, ONI labels (scripted backends)."""

import random

import pytest

from pipeline.envs.base import Game, StepResult, Task, register
from pipeline.envs.llm_host import (
    EnvironmentQuery,
    LLMEnvironmentResponder,
    answer_yes_no_batch,
    environment_default_reply,
)
from pipeline.llm import CachedBackend, Ledger
from pipeline.llm.base import ChatBackend, Generation, Sampling
from pipeline.llm.config import LLMConfig
from pipeline.llm.ledger import Usage
from pipeline.nethack.annotation import RETRY_PROMPT, annotate_preferences, label_messages
from pipeline.text.judge import ExactMatchJudge, JudgeItem, LLMJudge, Verdict, make_judge


class ScriptedBackend(ChatBackend):
    """Replies with ``script(conversation)``; records every conversation it was sent."""

    name = "scripted"

    def __init__(self, script):
        super().__init__("scripted")
        self.script = script
        self.sent = []

    def generate(self, conversations, sampling):
        self.sent += conversations
        out = []
        for c in conversations:
            reply = self.script(c)
            out.append(Generation(text="", error=reply[1]) if isinstance(reply, tuple) else Generation(text=reply))
        return out


def wrapped(script):
    inner = ScriptedBackend(script)
    return CachedBackend(inner, None, Ledger("test")), inner


# -- LLM environment -------------------------------------------------------------------------------------------
def test_environment_retries_then_defaults():
    def host(conv):
        question = conv[1]["content"]
        retries = sum(m["role"] == "assistant" for m in conv)
        if "Is it Paris?" in question:
            return "Goal reached."
        if "Is it big?" in question:
            return ["Well, yes, fairly big.", "**Yes**"][min(retries, 1)]  # valid on the first retry
        return "I'd rather not say."  # never valid

    backend, inner = wrapped(host)
    replies = answer_yes_no_batch(
        backend,
        ["Paris"] * 3,
        ["city"] * 3,
        [[], [("Is it in Europe?", "Yes")], []],
        ["Is it Paris?", "Is it big?", "Is it cold?"],
        max_retries=2,
    )
    assert replies == ["Goal reached", "Yes", environment_default_reply()]
    assert backend.ledger.unknowns == 1
    cold = [c for c in inner.sent if "Is it cold?" in c[1]["content"]]
    assert len(cold) == 3 and [len(c) for c in cold] == [2, 4, 6]  # each retry shows the bad reply + correction


def test_environment_resends_failed_requests_unchanged():
    calls = []

    def flaky(conv):
        calls.append(len(conv))
        return ("x", "HTTP 503") if len(calls) == 1 else "No"

    backend, _ = wrapped(flaky)
    assert LLMEnvironmentResponder(backend, max_retries=1).answer_batch(
        [EnvironmentQuery("cat", "animal", (), "Is it a fish?")]
    ) == ["No"]
    assert calls == [2, 2]


# -- judges -------------------------------------------------------------------------------------------------------
@register
class _ToyGame(Game):
    """Just enough of a game for the exact-match judge: the secret must be named."""

    name = "toy_guess"
    max_turns = 5

    def tasks(self, split):
        return [Task(self.name, "t0", "cat", "animal", split=split)]

    def system_prompt(self, task):
        return "Guess."

    def first_message(self, task):
        return "Go."

    def reset(self, task, rng: random.Random):
        return task

    def step(self, state, action):
        return StepResult("Goal reached" if self.is_correct_guess(state, action) else "No", False)

    def is_correct_guess(self, task, action):
        return task.env.lower() in action.lower()


def _item(action, claimed, conversation=None):
    task = Task("toy_guess", "t0", "cat", "animal").to_row()
    return JudgeItem(task=task, conversation=conversation or [], final_action=action, claimed_success=claimed)


def test_exact_match_judge():
    judge = make_judge(LLMConfig(backend="rules", model="exact_match"))
    assert isinstance(judge, ExactMatchJudge)
    verdicts = judge.judge(
        [_item("Is it a cat?", True), _item("Is it a dog?", True), _item("Is it a cat?", False), _item(None, True)]
    )
    assert [v.label for v in verdicts] == ["VALID", "NOTVALID", "NOTVALID", "NOTVALID"]
    assert judge.ledger.metrics("judge")["judge_requests"] == 4


def test_exact_match_judge_rejects_unknown_program():
    with pytest.raises(ValueError, match="unknown rules judge 'fuzzy'"):
        make_judge(LLMConfig(backend="rules", model="fuzzy"))


def test_llm_judge_parses_and_keeps_raw_text():
    answers = iter(["The guess names it.\n<VALID>", "Related only. <NOTVALID>", "I am not sure."])
    backend, inner = wrapped(lambda c: next(answers))
    judge = LLMJudge(backend, Sampling())
    conversation = [
        {"role": "assistant", "content": "<Answer>Is it a cat?</Answer>"},
        {"role": "user", "content": "Goal reached"},
    ]
    items = [
        _item("Is it a cat?", True, conversation),
        _item("Is it a kitten?", True),
        _item("no", True),
        _item("Is it a dog?", False),
    ]
    verdicts = judge.judge(items)
    asked = Usage(attempts=1, cached=False)  # one send each (the scripted backend counts no tokens)
    assert verdicts == [
        Verdict("VALID", "The guess names it.\n<VALID>", asked),
        Verdict("NOTVALID", "Related only. <NOTVALID>", asked),
        Verdict("UNKNOWN", "I am not sure.", asked),
        Verdict("NOTVALID", "", Usage()),  # not claimed: no request
    ]
    assert len(inner.sent) == 3 and '"cat"' in inner.sent[0][1]["content"]  # not-claimed games are not asked
    assert judge.ledger.unknowns == 1


# -- Motif preferences -----------------------------------------------------------------------------------------
def test_preferences_tie_without_call_retry_then_unknown():
    def annotator(conv):
        user = conv[1]["content"]
        if len(conv) > 2:  # the retry turn
            assert conv[-1]["content"] == RETRY_PROMPT
            return '("best_description": 2)' if "Hello" in user else "Still unsure."
        if "newt" in user:
            return 'The kill matters.\n("best_description": 1)'
        return "Hard to tell."

    backend, inner = wrapped(annotator)
    pairs = [("You kill the newt!", "It's a wall."), ("You see gold.", "Hello"), ("a", "b"), ("Same", "Same")]
    out = annotate_preferences(backend, pairs, "defaultgoal", "default", Sampling(temperature=0.1, seed=0))
    assert out[0][:2] == ("FIRST", 'The kill matters.\n("best_description": 1)')
    assert out[1][:2] == ("SECOND", 'Hard to tell.\n[retry]\n("best_description": 2)')
    assert out[2][:2] == ("UNKNOWN", "Hard to tell.\n[retry]\nStill unsure.")
    assert out[3] == ("TIE", "", Usage())  # no request
    assert [a.usage.attempts for a in out] == [1, 2, 2, 0]  # the retry turn is the row's second request
    assert len(inner.sent) == 5 and backend.ledger.unknowns == 1


def test_preferences_request_failure_is_unknown_without_retry_turn():
    backend, inner = wrapped(lambda c: ("", "timeout after 1 s"))
    out = annotate_preferences(backend, [("a", "b")], "gold", "reworded", Sampling(seed=0))
    assert out == [("UNKNOWN", "[request failed] timeout after 1 s", Usage(attempts=1, cached=False))]
    assert len(inner.sent) == 1


# -- ONI labels ------------------------------------------------------------------------------------------------
def test_message_labels_are_strict():
    replies = {
        '"You see gold."': "Gold helps.\n<label>helpful</label>",
        "wall": "A wall. Not helpful at all.",
        "door": "<label>unhelpful</label>",
    }
    backend, inner = wrapped(lambda c: next(v for k, v in replies.items() if k in c[1]["content"]))
    out = label_messages(backend, ["You see gold.", "It's a wall.", "The door is locked.", "  "], Sampling(seed=0))
    assert [a.label for a in out] == ["helpful", "UNKNOWN", "unhelpful", "unhelpful"]
    assert out[1][1] == "A wall. Not helpful at all." and len(inner.sent) == 3


def test_annotate_text_rows_carry_what_each_verdict_cost(tmp_path, monkeypatch):
    """annotate-text's rows: attempts, cache hit and tokens of the judge's request per row, summing to the stage's
    ledger; a second run served by the response cache pays nothing, row by row; the rules judge sends nothing."""
    import sys
    from pathlib import Path

    import stages.annotate_text as annotate
    from pipeline.core.artifacts import read_table
    from pipeline.core.stage import StageContext
    from pipeline.llm.cache import ResponseCache
    from pipeline.params import load_params

    sys.path.insert(0, str(Path(__file__).parent))
    from test_bad_inputs import ROLLOUT_SCHEMA, rollout_rows, write_dataset

    class Counting(ScriptedBackend):
        def generate(self, conversations, sampling):
            return [Generation(text=g.text, tokens_in=len(c[1]["content"]) // 4, tokens_out=7)
                    for g, c in zip(super().generate(conversations, sampling), conversations, strict=True)]

    def make_judge(cfg):  # an LLM judge, unsure of a wrong guess, behind a response cache both runs share
        script = Counting(lambda c: "hmm" if "something else" in c[1]["content"] else "<VALID>")
        return LLMJudge(CachedBackend(script, ResponseCache(tmp_path / "cache.sqlite"), Ledger("judge")), Sampling())

    monkeypatch.setattr(annotate, "make_judge", make_judge)
    rows = rollout_rows(24)
    for run in ("cold", "warm"):
        data = tmp_path / run
        write_dataset(data / "rollout_text", rows, ROLLOUT_SCHEMA)
        params = load_params("params.yaml", [f"data_dir={data}", "tracking.enabled=false"])
        metrics = annotate.run(params, StageContext()).metrics
        out = read_table(data / "annotate_text").to_pylist()
        asked = [r for r in out if r["success"]]  # a win never claimed is NOTVALID without a request
        assert all((r["judge_attempts"], r["judge_cached"], r["judge_tokens_in"]) == (0, None, 0)
                   for r in out if not r["success"])
        if run == "cold":
            assert all(r["judge_attempts"] == 1 and r["judge_cached"] is False and r["judge_tokens_out"] == 7
                       for r in asked)
            assert sum(r["judge_tokens_in"] for r in out) == metrics["judge_tokens_in"] > 0
            assert sum(r["judge_attempts"] for r in out) == metrics["judge_sent"] == len(asked)
        else:  # the VALID verdicts come from the cache; the unparsed ones ("hmm") are asked again
            assert {(r["judge_label"], r["judge_attempts"], r["judge_cached"], r["judge_tokens_in"])
                    for r in asked if r["judge_label"] == "VALID"} == {("VALID", 0, True, 0)}
            assert sum(r["judge_attempts"] for r in out) == metrics["judge_sent"] == sum(
                r["judge_label"] == "UNKNOWN" for r in asked) > 0
    rules = load_params("params.yaml", [f"data_dir={tmp_path / 'rules'}", "tracking.enabled=false"])
    write_dataset(tmp_path / "rules" / "rollout_text", rows, ROLLOUT_SCHEMA)
    monkeypatch.undo()
    annotate.run(rules, StageContext())
    out = read_table(tmp_path / "rules" / "annotate_text").to_pylist()
    assert {(r["judge_attempts"], r["judge_cached"], r["judge_tokens_in"], r["judge_tokens_out"]) for r in out} == {
        (0, None, 0, 0)}
