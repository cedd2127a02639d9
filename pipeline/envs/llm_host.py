"""Yes/no guessing games whose host is either the game's program or an LLM (twenty questions, guess my city).

With ``game.environment`` None the game's own program oracle answers (``play``). With a chat backend there
(``rollout_text.environment`` in params: ``pipeline.text.policies.make_games``), the host is PAPRIKA's LLM
environment: each turn, the questions of every live episode go out in one batch through
:func:`answer_yes_no_batch` (the ``prompts/environment.yaml`` prompt with the secret, its category and the
(question, reply) history; strict Yes / No / Goal reached validation; re-asks with a correction through
:func:`pipeline.llm.environment.valid_replies`; then the fixed default reply, counted as UNKNOWN in the
backend's ledger). "Goal reached" ends the
episode as a success, as in PAPRIKA (an LLM judge can audit claimed wins downstream).

The host's label is shown to the agent in the game's own wording ("Yes." / "No." / its goal and "cannot
answer" lines), so a policy sees the same replies whichever host answers.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pipeline.envs.base import StepResult, Task
from pipeline.envs.gamekit import Episode, TextGame
from pipeline.llm.base import ChatBackend, Conversation, Sampling
from pipeline.llm.environment import valid_replies
from pipeline.llm.prompts import load_prompt, render

_prompt = functools.partial(load_prompt, Path(__file__).parent / "prompts")
ENVIRONMENT_SAMPLING = Sampling(temperature=0.0, max_tokens=16)
ENVIRONMENT_REPLIES = ("Yes", "No", "Goal reached")
_REPLY_BY_NORM = {r.lower(): r for r in ENVIRONMENT_REPLIES}


# -- the host prompt ----------------------------------------------------------------------------------------
def environment_messages(
    secret: str, category: str, history: list[tuple[str, str]], question: str
) -> Conversation:
    """The host's conversation for one question. ``history`` is the (question, reply) pairs so far."""
    p = _prompt("environment")
    lines = [render(p["history_line"], n=i + 1, question=q, answer=a) for i, (q, a) in enumerate(history)]
    note = p["category_notes"].get(category.strip().lower(), "")
    return [
        {"role": "system", "content": render(p["system"], secret=secret, category=category, category_note=note)},
        {
            "role": "user",
            "content": render(p["user"], history="\n".join(lines) or p["empty_history"], question=question),
        },
    ]


def parse_environment_reply(text: str) -> str | None:
    """ "Yes" / "No" / "Goal reached" when the reply is exactly one of them (case, quotes, markup and end
    punctuation aside); None for anything else, e.g. "Yes, it is." or "Goal reached? No."."""
    norm = re.sub(r"[\s\"'`*_]+", " ", text).strip().rstrip(".!").strip().lower()
    return _REPLY_BY_NORM.get(norm)


def environment_retry() -> str:
    return _prompt("environment")["retry"]


def environment_default_reply() -> str:
    return _prompt("environment")["default_reply"]


# -- the LLM host ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EnvironmentQuery:
    """One question to the host: the secret, its category, the (question, reply) history and the question."""

    secret: str
    category: str
    history: tuple[tuple[str, str], ...] | list[tuple[str, str]]
    question: str


class LLMEnvironmentResponder:
    """Batched host replies with strict validation.

    Args:
        backend: the environment's chat backend (normally a CachedBackend from ``make_backend``).
        max_retries: re-asks after an invalid reply (PAPRIKA: 5).
        sampling: defaults to greedy, 16 tokens.
    """

    def __init__(self, backend: ChatBackend, max_retries: int = 5, sampling: Sampling | None = None) -> None:
        self.backend = backend
        self.max_retries = max_retries
        self.sampling = sampling or ENVIRONMENT_SAMPLING

    def answer_batch(self, items: list[EnvironmentQuery]) -> list[str]:
        conversations: list[Conversation] = [
            environment_messages(q.secret, q.category, list(q.history), q.question) for q in items
        ]
        replies, _ = valid_replies(self.backend, conversations, self.sampling,
                                   lambda _, text: parse_environment_reply(text), environment_retry(),
                                   self.max_retries)
        default = environment_default_reply()
        return [r if r is not None else default for r in replies]


def answer_yes_no_batch(
    backend: ChatBackend,
    secrets: list[str],
    categories: list[str],
    histories: list[list[tuple[str, str]]],
    questions: list[str],
    *,
    max_retries: int = 5,
    sampling: Sampling | None = None,
) -> list[str]:
    """Host replies ("Yes" / "No" / "Goal reached", or the default reply) for parallel episodes."""
    items = [
        EnvironmentQuery(s, c, tuple(h), q)
        for s, c, h, q in zip(secrets, categories, histories, questions, strict=True)
    ]
    return LLMEnvironmentResponder(backend, max_retries=max_retries, sampling=sampling).answer_batch(items)


HOST_HISTORY = "host_history"  # state attribute: the LLM host's (question, label) pairs so far


def host_history(state: Episode) -> list[tuple[str, str]]:
    """The (question, host label) pairs an LLM host has answered in this episode (kept on the state)."""
    history = getattr(state, HOST_HISTORY, None)
    if history is None:
        history = []
        setattr(state, HOST_HISTORY, history)
    return history


class YesNoHostGame(TextGame):
    """A TextGame answered by its program, or by ``self.environment`` (an LLM) when one is set.

    Subclasses name the prompt keys of their replies (``host_reply_keys``: host label -> prompt key, plus
    ``host_unknown_key`` for a defaulted answer) and may override ``host_secret`` / ``host_category``.
    """

    host_reply_keys: ClassVar[dict[str, str]] = {"Yes": "yes", "No": "no", "Goal reached": "goal"}
    host_unknown_key: ClassVar[str] = "unknown"
    #: re-asks after a reply that is not exactly Yes / No / Goal reached (PAPRIKA: 5)
    host_max_retries: ClassVar[int] = 5

    def host_secret(self, task: Task) -> str:
        """What the LLM host is told the secret is."""
        return str(task.env)

    def host_category(self, task: Task) -> str:
        return task.agent

    def step(self, state: Any, action: str) -> StepResult:
        if self.environment is None:
            return super().step(state, action)
        return self.step_batch([state], [action])[0]

    def step_batch(self, states: list[Any], actions: list[str]) -> list[StepResult]:
        if self.environment is None:
            return super().step_batch(states, actions)
        results = [self.game_over(s) for s in states]
        live = [i for i, s in enumerate(states) if not s.done]
        if not live:
            return results
        questions = [actions[i].strip() for i in live]
        histories = [host_history(states[i]) for i in live]
        replies = answer_yes_no_batch(
            self.environment,
            [self.host_secret(states[i].task) for i in live],
            [self.host_category(states[i].task) for i in live],
            [list(h) for h in histories],
            questions,
            max_retries=self.host_max_retries,
        )
        for i, question, history, reply in zip(live, questions, histories, replies, strict=True):
            state = states[i]
            state.turns += 1
            history.append((question, reply))
            label = reply if reply in ENVIRONMENT_REPLIES else None
            key = self.host_reply_keys[label] if label is not None else self.host_unknown_key
            success = label == "Goal reached"
            result = StepResult(
                self.prompts(key),
                done=success,
                success=success,
                info={"host": "llm", "host_reply": label or "UNKNOWN", "unanswerable": label is None},
            )
            results[i] = self.finish_turn(state, result)
        return results
