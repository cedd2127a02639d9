"""Content-addressed response cache on SQLite, and the wrapper that puts every backend behind it.

Key = sha256(backend, model identity, messages, sampling params). The file is shared across runs, stages
and processes: WAL journal, a busy timeout and ``INSERT OR IGNORE`` make concurrent writers safe (two
writers of the same key store the same answer once).

What is cached: a request whose answer is a function of its key, i.e. greedy decoding (temperature 0) or
sampling with an explicit seed (the seed is in the key). A sampled request without a seed is a fresh draw
each time, so it bypasses the cache and in-batch dedup; the same conversation sent eight times then gets
eight samples, which is what rollouts at temperature > 0 rely on.

Only answers are stored as answers: a caller that parses them passes ``accept`` (the parser), and a request
that failed or whose text the parser rejects goes to the ``failures`` table with its attempt count instead.
A rerun asks it again, until ``max_attempts`` tries; then the last failure is served without a request (the
row stays UNKNOWN). A cache file that SQLite cannot read is moved aside with a one-line warning and rebuilt.
A batch in which no request reached the server (connection errors after the backend's retries) raises
``ServerUnavailable``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

from pipeline.core.errors import DiskFull, ServerUnavailable, disk_full
from pipeline.llm.base import ChatBackend, Conversation, Generation, Sampling
from pipeline.llm.ledger import Ledger

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "CURIO_CACHE_DIR"
CACHE_FILE = "llm-cache.sqlite"
_SQL_VARS = 500  # keys per SELECT ... IN (...)
DEFAULT_MAX_ATTEMPTS = 3
#: Error prefix of the openai backend for a request that never reached the server (refused, DNS, reset).
UNREACHED = "connection error"
_TABLES = (
    "CREATE TABLE IF NOT EXISTS responses ("
    " key TEXT PRIMARY KEY, text TEXT NOT NULL, token_logprobs TEXT,"
    " tokens_in INTEGER NOT NULL, tokens_out INTEGER NOT NULL, created REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS failures ("
    " key TEXT PRIMARY KEY, attempts INTEGER NOT NULL, text TEXT NOT NULL, error TEXT, updated REAL NOT NULL)",
)


def default_cache_path() -> Path:
    """``$CURIO_CACHE_DIR/llm-cache.sqlite``, else ``<cwd>/.cache/curio/llm-cache.sqlite``."""
    root = os.environ.get(CACHE_DIR_ENV)
    return (Path(root) if root else Path.cwd() / ".cache" / "curio") / CACHE_FILE


def request_key(backend: str, model: str, conversation: Conversation, sampling: Sampling) -> str:
    blob = json.dumps(
        {"backend": backend, "model": model, "messages": conversation, "sampling": sampling.key()},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def is_cacheable(sampling: Sampling) -> bool:
    """Greedy requests, or sampled ones with a seed: the answer is then a function of the key."""
    return sampling.temperature == 0 or sampling.seed is not None


def model_identity(model: str) -> str:
    """The model name, plus the size and mtime of its weight files when it is a local directory.

    Retraining a model in place (same path, new weights) must not serve answers of the old weights.
    """
    path = Path(model)
    if not model or not path.is_dir():
        return model
    stamps = sorted(
        f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}"
        for p in path.iterdir()
        if p.suffix in {".safetensors", ".bin", ".pt", ".gguf"}
    )
    return model + "@" + hashlib.sha256("|".join(stamps).encode()).hexdigest()[:16] if stamps else model


class ResponseCache:
    """SQLite key → Generation store (answers, and failures with attempt counts); one connection per thread
    and process."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_cache_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        try:
            self._create()
        except sqlite3.DatabaseError as e:
            if disk_full(e) is not None:  # a full disk is not a corrupt cache: keep the file, say so
                raise DiskFull.at(self.path) from e
            self._move_aside(e)
            self._create()

    def _create(self) -> None:
        conn = self._conn()
        for sql in _TABLES:
            conn.execute(sql)
        conn.execute("SELECT COUNT(*) FROM responses").fetchone()

    def _move_aside(self, error: Exception) -> None:
        """Keep the unreadable file (and its WAL) for inspection under a new name; start an empty cache."""
        self.close()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(self.path) + suffix)
            if src.exists():
                os.replace(src, Path(str(aside) + suffix))
        log.warning("llm cache %s is unreadable (%s): moved to %s, starting an empty cache", self.path, error,
                    aside.name)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or self._local.pid != os.getpid():
            conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA busy_timeout=60000")
                conn.execute("PRAGMA synchronous=NORMAL")
            except sqlite3.DatabaseError:
                conn.close()
                raise
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def get_many(self, keys: list[str]) -> dict[str, Generation]:
        found: dict[str, Generation] = {}
        conn = self._conn()
        for start in range(0, len(keys), _SQL_VARS):
            part = keys[start : start + _SQL_VARS]
            rows = conn.execute(
                f"SELECT key, text, token_logprobs, tokens_in, tokens_out FROM responses"
                f" WHERE key IN ({','.join('?' * len(part))})",
                part,
            ).fetchall()
            for key, text, logprobs, tokens_in, tokens_out in rows:
                found[key] = Generation(
                    text=text,
                    token_logprobs=json.loads(logprobs) if logprobs else None,
                    tokens_in=tokens_in,
                    tokens_out=tokens_out,
                    cached=True,
                )
        return found

    def failures(self, keys: list[str]) -> dict[str, tuple[int, Generation]]:
        """(attempts, last failure) of the keys whose requests failed or were rejected."""
        found: dict[str, tuple[int, Generation]] = {}
        conn = self._conn()
        for start in range(0, len(keys), _SQL_VARS):
            part = keys[start : start + _SQL_VARS]
            rows = conn.execute(
                f"SELECT key, attempts, text, error FROM failures WHERE key IN ({','.join('?' * len(part))})", part
            ).fetchall()
            for key, attempts, text, error in rows:
                found[key] = (attempts, Generation(text=text, error=error, cached=True,
                                                   meta={"attempts": attempts, "given_up": True}))
        return found

    def record_failures(self, items: dict[str, Generation]) -> None:
        """Count one more attempt for each key; keep its last text and error."""
        if not items:
            return
        now = time.time()
        rows = [(k, g.text, g.error, now) for k, g in items.items()]
        with self._transaction() as conn:
            conn.executemany(
                "INSERT INTO failures VALUES (?, 1, ?, ?, ?) ON CONFLICT(key) DO UPDATE SET"
                " attempts = attempts + 1, text = excluded.text, error = excluded.error, updated = excluded.updated",
                rows,
            )

    def put_many(self, items: dict[str, Generation]) -> None:
        """Store successful generations (their failure records are cleared); existing keys are left as they are."""
        rows = [
            (
                k,
                g.text,
                json.dumps(g.token_logprobs) if g.token_logprobs is not None else None,
                g.tokens_in,
                g.tokens_out,
                time.time(),
            )
            for k, g in items.items()
            if g.error is None
        ]
        if not rows:
            return
        with self._transaction() as conn:
            conn.executemany("INSERT OR IGNORE INTO responses VALUES (?, ?, ?, ?, ?, ?)", rows)
            conn.executemany("DELETE FROM failures WHERE key = ?", [(r[0],) for r in rows])

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, rolled back on any failure; a full disk is :class:`DiskFull` naming the cache
        (what was committed before stays, nothing half-written counts: SQLite's journal sees to it)."""
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.DatabaseError as e:
            if disk_full(e) is not None:
                raise DiskFull.at(self.path) from e
            raise

    def __len__(self) -> int:
        return self._conn().execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


class CachedBackend(ChatBackend):
    """Wraps a backend: dedups identical requests in a batch and in flight, sends only cache misses.

    Args:
        inner: the backend that really answers.
        cache: the persistent cache; None keeps dedup and accounting but stores nothing.
        ledger: where requests, hits, tokens and latencies are counted.
        max_attempts: sends of one request, over runs, while it fails or its answer is rejected.
    """

    def __init__(
        self,
        inner: ChatBackend,
        cache: ResponseCache | None = None,
        ledger: Ledger | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        super().__init__(inner.model)
        self.inner = inner
        self.name = inner.name
        self.cache = cache
        self.ledger = ledger or Ledger()
        self.max_attempts = max_attempts
        self._identity = model_identity(inner.model)  # a backend without a cache_identity of its own
        self._lock = threading.Lock()
        self._in_flight: dict[str, Future[Generation]] = {}

    @property
    def identity(self) -> str:
        """The weights answering, read at each request: a backend that loads other weights in place (vLLM in online
        RL) updates its ``cache_identity``, and no answer of the old weights is replayed after."""
        return getattr(self.inner, "cache_identity", None) or self._identity

    def generate(
        self, conversations: list[Conversation], sampling: Sampling, *, accept: Callable[[str], bool] | None = None
    ) -> list[Generation]:
        """One Generation per conversation. ``accept(text)``: whether an answer may be cached as an answer
        (the caller's parser); a rejected or failed one is recorded as a failed attempt instead."""
        n = len(conversations)
        if n == 0:
            return []
        if not is_cacheable(sampling):
            self.ledger.record_batch(requests=n, unique=n)
            return self._send(conversations, sampling)

        keys = [request_key(self.name, self.identity, c, sampling) for c in conversations]
        first: dict[str, int] = {}
        for i, k in enumerate(keys):
            first.setdefault(k, i)
        results = self.cache.get_many(list(first)) if self.cache is not None else {}
        if self.cache is not None:
            missing = [k for k in first if k not in results]
            for k, (attempts, failure) in self.cache.failures(missing).items():
                if attempts >= self.max_attempts:
                    results[k] = failure  # given up on (meta["given_up"]): the last failure, not sent again
        hits = len(results)

        mine: list[str] = []
        theirs: dict[str, Future[Generation]] = {}
        with self._lock:
            for k in first:
                if k in results:
                    continue
                if k in self._in_flight:
                    theirs[k] = self._in_flight[k]
                else:
                    self._in_flight[k] = Future()
                    mine.append(k)
        self.ledger.record_batch(requests=n, unique=len(first), cache_hits=hits, shared=len(theirs))

        try:
            if mine:
                fresh = self._send([conversations[first[k]] for k in mine], sampling)
                if self.cache is not None:
                    answered = dict(zip(mine, fresh, strict=True))
                    bad = {k: g for k, g in answered.items()
                           if g.error is not None or (accept is not None and not accept(g.text))}
                    self.cache.put_many({k: g for k, g in answered.items() if k not in bad})
                    self.cache.record_failures(bad)
                for k, g in zip(mine, fresh, strict=True):
                    results[k] = g
                    self._in_flight[k].set_result(g)
        except BaseException as e:
            for k in mine:
                if not self._in_flight[k].done():
                    self._in_flight[k].set_exception(e)
            raise
        finally:
            with self._lock:
                for k in mine:
                    self._in_flight.pop(k, None)
        for k, fut in theirs.items():
            results[k] = replace(fut.result(), cached=True)

        out: list[Generation] = []
        for i, k in enumerate(keys):
            g = results[k]
            # Only the request that was really sent counts as not cached; copies get their own meta.
            out.append(g if i == first[k] and not g.cached else replace(g, cached=True, meta=dict(g.meta)))
        return out

    def keep(self, conversations: list[Conversation], sampling: Sampling, generations: list[Generation]) -> None:
        """Store answers the caller's ``accept`` rejected but that proved usable after all (e.g. a retry turn
        appended to them parsed), so a rerun replays them instead of asking again."""
        if self.cache is None or not is_cacheable(sampling):
            return
        self.cache.put_many({request_key(self.name, self.identity, c, sampling): g
                             for c, g in zip(conversations, generations, strict=True) if g.error is None})

    def _send(self, conversations: list[Conversation], sampling: Sampling) -> list[Generation]:
        start = time.monotonic()
        generations = self.inner.generate(conversations, sampling)
        if len(generations) != len(conversations):
            raise RuntimeError(f"{self.name} backend returned {len(generations)} answers for {len(conversations)}")
        elapsed = time.monotonic() - start
        for g in generations:
            self.ledger.record_sent(g, elapsed)
        if generations and all(g.error is not None and g.error.startswith(UNREACHED) for g in generations):
            where = getattr(self.inner, "base_url", None) or self.name
            raise ServerUnavailable(f"llm: {where} did not answer any of {len(generations)} request(s) after "
                                    f"retries ({generations[0].error}); start the server or fix base_url, then "
                                    "rerun (finished work is kept)")
        return generations

    @property
    def owns_process(self) -> bool:
        """Whether the backend runs a server of its own (vllm), which must stop when the backend is dropped."""
        return bool(getattr(self.inner, "owns_process", False))

    def close(self) -> None:
        self.inner.close()
        if self.cache is not None:
            self.cache.close()


def ask(
    backend: ChatBackend, conversations: list[Conversation], sampling: Sampling, accept: Callable[[str], bool]
) -> list[Generation]:
    """``backend.generate``; a cached backend stores only answers ``accept`` parses (failures are re-asked on a
    rerun, a bounded number of times)."""
    if isinstance(backend, CachedBackend):
        return backend.generate(conversations, sampling, accept=accept)
    return backend.generate(conversations, sampling)
