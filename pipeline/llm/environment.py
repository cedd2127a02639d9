"""An LLM as a game's environment: the one loop that asks it until its reply is valid, and its accounting.

:func:`valid_replies` is how every LLM-hosted game (``pipeline.envs.llm_host``: Yes / No / Goal reached hosts;
``pipeline.envs.simulated``: scenario role-play) gets its replies: a reply the game's parser rejects is shown
back with the game's correction turn appended (so a greedy model sees a new prompt), up to ``max_retries``
times; what is still invalid then is counted as UNKNOWN in the ledger and left to the game's fallback. What the
environment cost a stage (its ledger: requests, dedup, cache hits, tokens, latency, retries, failures, UNKNOWNs)
goes into the stage's metrics as ``environment/...`` keys: from the games (:func:`environment_metrics`) or from
an :func:`environment_accounting` block around the whole stage.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from pipeline.llm.base import ChatBackend, Conversation, Sampling
from pipeline.llm.ledger import Ledger

T = TypeVar("T")


def ledger_of(backend: object) -> Ledger | None:
    return getattr(backend, "ledger", None)


def valid_replies(
    backend: ChatBackend,
    conversations: list[Conversation],
    sampling: Sampling,
    parse: Callable[[int, str], T | None],
    correction: str,
    max_retries: int,
) -> tuple[list[T | None], list[int]]:
    """The environment's reply to each conversation, as ``parse(index, text)`` reads it, and the retries each took.

    A reply ``parse`` rejects (None) is shown back to the model with ``correction`` as the next user turn and
    asked again; a failed request is resent as it was. After ``max_retries`` retries a reply is None (the
    caller's fallback), counted as UNKNOWN in the backend's ledger.
    """
    conversations = list(conversations)
    values: list[T | None] = [None] * len(conversations)
    retries = [0] * len(conversations)
    pending = list(range(len(conversations)))
    while pending:
        generations = backend.generate([conversations[i] for i in pending], sampling)
        still: list[int] = []
        for i, g in zip(pending, generations, strict=True):
            value = parse(i, g.text) if g.error is None else None
            if value is not None:
                values[i] = value
            elif retries[i] < max_retries:
                retries[i] += 1
                if g.error is None:  # a bad answer: show it and ask again; a failed request is simply resent
                    conversations[i] = [
                        *conversations[i],
                        {"role": "assistant", "content": g.text if g.text.strip() else "..."},
                        {"role": "user", "content": correction},
                    ]
                still.append(i)
        pending = still
    unknown = sum(v is None for v in values)
    ledger = ledger_of(backend)
    if unknown and ledger is not None:
        ledger.count_unknown(unknown)
    return values, retries


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
