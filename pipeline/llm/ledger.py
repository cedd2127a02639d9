"""What one LLM role cost a stage: requests, dedup, cache hits, tokens, latency, retries, failures, UNKNOWNs."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import numpy as np

from pipeline.llm.base import Generation


@dataclass(frozen=True)
class Usage:
    """What the requests behind one answer (one dataset row) cost, counted as the :class:`Ledger` counts them: summed
    over a stage's rows the attempts are the ledger's ``sent + retries`` and the tokens its ``tokens_in`` /
    ``tokens_out``."""

    attempts: int = 0  # sends to the backend, the backend's retries included (0: no request of its own)
    cached: bool | None = None  # answered without a send: the response cache, or the same request in the same
    # batch or in flight; None: no request at all (a program's or the embedding model's answer, a rule's default)
    tokens_in: int = 0  # prompt tokens of the sends (0 for a cached answer: the ledger counts only what was sent)
    tokens_out: int = 0  # generated tokens of the sends

    @classmethod
    def of(cls, generation: Generation) -> Usage:
        """The usage of one answer of a chat backend (``CachedBackend`` marks what it did not send as cached)."""
        if generation.cached:
            return cls(cached=True)
        return cls(attempts=1 + int(generation.meta.get("retries", 0)), cached=False,
                   tokens_in=generation.tokens_in, tokens_out=generation.tokens_out)

    def shared(self) -> Usage:
        """The same answer used again by another row: no send of its own."""
        return self if self.cached is None else Usage(cached=True)

    def __add__(self, other: Usage) -> Usage:
        """Two requests behind one row: cached only when neither was sent."""
        cached = other.cached if self.cached is None else self.cached if other.cached is None else (
            self.cached and other.cached)
        return replace(self, attempts=self.attempts + other.attempts, cached=cached,
                       tokens_in=self.tokens_in + other.tokens_in, tokens_out=self.tokens_out + other.tokens_out)


#: What each counter of :meth:`Ledger.metrics` means (a stage's metrics name them after a prefix: judge_requests).
METRIC_HELP = {
    "requests": "items asked of the LLM role in this run",
    "unique_requests": "distinct requests among them, within each batch",
    "cache_hits": "distinct requests answered by the persistent LLM cache",
    "shared_in_flight": "distinct requests answered by an identical request already in flight",
    "sent": "requests that reached the backend",
    "tokens_in": "prompt tokens of the requests sent",
    "tokens_out": "generated tokens of the requests sent",
    "latency_p50_s": "median seconds a sent request took",
    "latency_p95_s": "95th percentile of the seconds a sent request took",
    "retries": "retries of sent requests (server errors, timeouts)",
    "failures": "sent requests that failed for good",
    "unknowns": "answers that could not be parsed (or were defaulted)",
}


def metric_prefix(prefix: str) -> str:
    """A ledger's metrics prefix, ending in a separator (``judge`` -> ``judge_``; ``environment/`` stays)."""
    return prefix + "_" if prefix and prefix[-1] not in "._/-" else prefix


def metric_help(prefix: str, role: str) -> dict[str, str]:
    """:data:`METRIC_HELP` as a stage declares it (:attr:`pipeline.core.stage.Stage.metric_help`): the keys
    :meth:`Ledger.metrics` writes with ``prefix``, each meaning said of ``role``."""
    return {metric_prefix(prefix) + k: f"{role}: {v}" for k, v in METRIC_HELP.items()}


class Ledger:
    """Thread-safe counters for one role; ``metrics()`` is what a stage merges into its metrics file."""

    def __init__(self, role: str = "llm") -> None:
        self.role = role
        self._lock = threading.Lock()
        self.requests = 0  # items asked for
        self.unique_requests = 0  # distinct requests within each batch
        self.cache_hits = 0  # distinct requests answered by the persistent cache
        self.shared = 0  # distinct requests answered by an identical request already in flight
        self.sent = 0  # requests that reached the backend
        self.tokens_in = 0
        self.tokens_out = 0
        self.retries = 0
        self.failures = 0  # sent requests that failed for good
        self.unknowns = 0  # answers that could not be parsed (or defaulted)
        self._latencies: list[float] = []

    def record_batch(self, requests: int, unique: int, cache_hits: int = 0, shared: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.unique_requests += unique
            self.cache_hits += cache_hits
            self.shared += shared

    def record_sent(self, generation: Generation, latency_s: float) -> None:
        """Account one request that actually reached the backend."""
        with self._lock:
            self.sent += 1
            self.tokens_in += generation.tokens_in
            self.tokens_out += generation.tokens_out
            self.retries += int(generation.meta.get("retries", 0))
            self.failures += generation.error is not None
            self._latencies.append(float(generation.meta.get("latency_s", latency_s)))

    def record_computed(self, n: int, latency_s: float) -> None:
        """Account ``n`` items computed together in ``latency_s`` (e.g. a batch of embeddings)."""
        with self._lock:
            self.sent += n
            self._latencies.extend([latency_s] * n)

    @classmethod
    def merged(cls, ledgers: list[Ledger], role: str = "llm") -> Ledger:
        """One ledger holding the sums (and all latencies) of ``ledgers``."""
        out = cls(role)
        counters = (
            "requests",
            "unique_requests",
            "cache_hits",
            "shared",
            "sent",
            "tokens_in",
            "tokens_out",
            "retries",
            "failures",
            "unknowns",
        )
        for ledger in ledgers:
            with ledger._lock:
                for name in counters:
                    setattr(out, name, getattr(out, name) + getattr(ledger, name))
                out._latencies.extend(ledger._latencies)
        return out

    def count_unknown(self, n: int = 1) -> None:
        with self._lock:
            self.unknowns += n

    def metrics(self, prefix: str | None = None) -> dict[str, float | int]:
        """Flat dict ``{<prefix>_<counter>: value}`` (:data:`METRIC_HELP`); the prefix defaults to ``llm_<role>``."""
        prefix = metric_prefix(f"llm_{self.role}" if prefix is None else prefix)
        with self._lock:
            lat = np.asarray(self._latencies, dtype=float)
            values: dict[str, float | int] = {
                "requests": self.requests,
                "unique_requests": self.unique_requests,
                "cache_hits": self.cache_hits,
                "shared_in_flight": self.shared,
                "sent": self.sent,
                "tokens_in": self.tokens_in,
                "tokens_out": self.tokens_out,
                "latency_p50_s": round(float(np.percentile(lat, 50)), 4) if lat.size else 0.0,
                "latency_p95_s": round(float(np.percentile(lat, 95)), 4) if lat.size else 0.0,
                "retries": self.retries,
                "failures": self.failures,
                "unknowns": self.unknowns,
            }
        return {prefix + k: v for k, v in values.items()}
