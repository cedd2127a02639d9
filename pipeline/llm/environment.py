"""An LLM as the environment of a guessing game: answers restricted to Yes / No / Goal reached.

A reply outside the three is re-asked with a correction turn appended (so a greedy model sees a new prompt),
up to ``max_retries`` times; then the fixed default reply is used and counted as UNKNOWN in the ledger.
Games call :func:`answer_yes_no_batch` from ``step_batch`` when ``game.environment`` is an LLM backend
(``pipeline.envs.llm_host``). What the environment cost a stage (its ledger: requests, dedup, cache hits, tokens,
latency, retries, failures, UNKNOWNs) goes into the stage's metrics as ``environment/...`` keys: from the games
(:func:`environment_metrics`) or from an :func:`environment_accounting` block around the whole stage.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from pipeline.llm.base import ChatBackend, Conversation, Sampling
from pipeline.llm.ledger import Ledger
from pipeline.llm.prompts import (
    environment_default_reply,
    environment_messages,
    environment_retry,
    parse_environment_reply,
)

ENVIRONMENT_SAMPLING = Sampling(temperature=0.0, max_tokens=16)


def ledger_of(backend: object) -> Ledger | None:
    return getattr(backend, "ledger", None)


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
        replies: list[str | None] = [None] * len(items)
        pending = list(range(len(items)))
        retry = environment_retry()
        for _ in range(self.max_retries + 1):
            if not pending:
                break
            generations = self.backend.generate([conversations[i] for i in pending], self.sampling)
            still: list[int] = []
            for i, g in zip(pending, generations, strict=True):
                reply = parse_environment_reply(g.text) if g.error is None else None
                if reply is not None:
                    replies[i] = reply
                    continue
                if g.error is None:  # a bad answer: show it and ask again; a failed request is simply resent
                    conversations[i] = [
                        *conversations[i],
                        {"role": "assistant", "content": g.text},
                        {"role": "user", "content": retry},
                    ]
                still.append(i)
            pending = still
        if pending:
            ledger = ledger_of(self.backend)
            if ledger is not None:
                ledger.count_unknown(len(pending))
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


# -- accounting: the environment's ledger in a stage's metrics -------------------------------------------------
METRICS_PREFIX = "environment/"


def environment_metrics(games: Iterable[Any], prefix: str = METRICS_PREFIX) -> dict[str, float | int]:
    """The ledger of the LLM environment behind ``games`` as ``environment/<counter>`` metrics.

    Empty when every game answers with its own program. Games normally share one backend (``make_games``);
    distinct ledgers are merged.
    """
    ledgers = {id(led): led for g in games if (led := ledger_of(getattr(g, "environment", None))) is not None}
    if not ledgers:
        return {}
    return Ledger.merged(list(ledgers.values()), role="environment").metrics(prefix)


class EnvironmentAccounting:
    """One ledger (and one backend per config) for every environment built inside an accounting block."""

    def __init__(self) -> None:
        self.ledger = Ledger("environment")
        self.used = False  # an LLM environment was built in the block
        self._backends: dict[str, ChatBackend] = {}
        self._lock = threading.Lock()

    def backend(self, cfg: Any, build: Callable[[], ChatBackend | None]) -> ChatBackend | None:
        key = cfg.model_dump_json() if hasattr(cfg, "model_dump_json") else repr(cfg)
        with self._lock:
            if key not in self._backends:
                backend = build()
                if backend is None:
                    return None
                self._backends[key] = backend
                self.used = True
            return self._backends[key]

    def metrics(self, prefix: str = METRICS_PREFIX) -> dict[str, float | int]:
        """The ledger as metrics; empty when no LLM environment was built in the block."""
        return self.ledger.metrics(prefix) if self.used else {}

    def close(self) -> None:
        with self._lock:
            backends, self._backends = list(self._backends.values()), {}
        for b in backends:
            b.close()


_ACCOUNTING: ContextVar[EnvironmentAccounting | None] = ContextVar("curio_environment_accounting", default=None)


def current_accounting() -> EnvironmentAccounting | None:
    return _ACCOUNTING.get()


@contextmanager
def environment_accounting() -> Iterator[EnvironmentAccounting]:
    """Within the block (this thread / context), ``make_environment`` shares one backend per config and one
    ledger; the backends are closed on exit, ``.metrics()`` stays readable::

        with environment_accounting() as env:
            ...  # make_games(params) as often as needed
        metrics.update(env.metrics())
    """
    scope = EnvironmentAccounting()
    token = _ACCOUNTING.set(scope)
    try:
        yield scope
    finally:
        _ACCOUNTING.reset(token)
        scope.close()
