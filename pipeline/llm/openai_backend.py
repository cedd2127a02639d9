"""Any OpenAI-compatible chat server (vLLM's server, FastChat, OpenAI) through the official async client.

``generate`` is synchronous: requests run on an event loop owned by the backend (one background thread), so
stages, Prefect tasks and tests call it like any other backend. Each request has a timeout; 429 / 5xx /
timeouts / connection errors / malformed bodies are retried with exponential backoff and jitter; a request
that fails for good comes back as ``Generation(text="", error=...)`` instead of raising.

Several servers (``base_url`` a list: vLLM / llama.cpp replicas of one model) are used at once: each request
goes to the live replica with the fewest requests outstanding, each replica has at most ``max_concurrency``
in flight (over every concurrent batch). A replica whose connection fails (or that fails ``TRIP_AFTER``
requests in a row) is skipped for a cool-down that doubles on each new trip, then gets one probe request, and
its full share again once that succeeds; its requests move to the others at once. With one server, failures
are only retried with backoff.

The API key is read from the environment variable *named* in params (``api_key_env``) and lives only in the
client object; error messages are scrubbed of it before they are stored or logged.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import multiprocessing
import os
import random
import threading
import time
from typing import Any

import openai

from pipeline.llm.base import ChatBackend, Conversation, Generation, Sampling

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 409, 425, 429})
NO_KEY = "EMPTY"  # local servers accept any key; sent when no api_key_env is configured
TRIP_AFTER = 3  # consecutive failed requests (5xx, timeouts) that take a replica out; a refused connection: 1


class MalformedResponse(ValueError):
    """A 2xx response whose body is not a chat completion."""


def read_api_key(api_key_env: str | None) -> str:
    """The key from ``$api_key_env``; a one-line error naming the variable when it is not set."""
    if not api_key_env:
        return NO_KEY
    value = os.environ.get(api_key_env)
    if not value:
        raise ValueError(f"llm: environment variable {api_key_env} (named by api_key_env) is not set")
    return value


def _root_cause(e: BaseException) -> BaseException:
    """The innermost exception of a ``raise ... from ...`` chain."""
    seen = {id(e)}
    while e.__cause__ is not None and id(e.__cause__) not in seen:
        e = e.__cause__
        seen.add(id(e))
    return e


def _http_client(max_concurrency: int) -> Any:
    """The SDK's aiohttp transport when available (far less CPU per request than httpx), else httpx."""
    try:  # openai >= 3 ships on httpx2, older releases on httpx
        import httpx2 as httpx
    except ImportError:
        import httpx

    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
    aiohttp_client = getattr(openai, "DefaultAioHttpClient", None)
    if aiohttp_client is not None:
        try:
            return aiohttp_client(limits=limits)
        except RuntimeError:  # the SDK's aiohttp extra is not installed
            pass
    return openai.DefaultAsyncHttpxClient(limits=limits)


def _refused(e: BaseException) -> bool:
    """A connection-level failure (refused, reset, server gone), not a slow answer."""
    if not isinstance(e, openai.APIConnectionError):
        return False
    root = _root_cause(e)
    return not isinstance(root, asyncio.TimeoutError | TimeoutError) and not (
        root is e and isinstance(e, openai.APITimeoutError)
    )


def parse_completion(data: Any, want_logprobs: bool) -> Generation:
    """A chat-completion JSON body → Generation; raises MalformedResponse on anything else."""
    try:
        choice = data["choices"][0]
        text = choice["message"].get("content") or ""
        usage = data.get("usage") or {}
        logprobs = None
        if want_logprobs and choice.get("logprobs"):
            logprobs = [float(t["logprob"]) for t in choice["logprobs"].get("content") or []]
        generation = Generation(
            text=str(text),
            token_logprobs=logprobs,
            tokens_in=int(usage.get("prompt_tokens") or 0),
            tokens_out=int(usage.get("completion_tokens") or 0),
        )
        if choice.get("token_ids") is not None:  # vLLM's return_token_ids: the ids the engine sampled
            generation.meta["token_ids"] = [int(t) for t in choice["token_ids"]]
        return generation
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
        raise MalformedResponse(f"malformed completion body ({type(e).__name__})") from None


class _Replica:
    """One server: its client, requests in flight, and circuit-breaker state."""

    __slots__ = ("url", "client", "outstanding", "failures", "trips", "down_until")

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.client: openai.AsyncOpenAI | None = None
        self.outstanding = 0
        self.failures = 0  # consecutive failed requests
        self.trips = 0  # consecutive cool-downs (doubles the next one)
        self.down_until = 0.0


class OpenAIBackend(ChatBackend):
    """Batched chat over HTTP with bounded concurrency, timeouts and retries.

    Args:
        model: the served model name.
        base_url: server URL ending in ``/v1``, or a list of them (replicas of one model); None = the SDK
            default (api.openai.com or $OPENAI_BASE_URL).
        api_key_env: NAME of the environment variable holding the key; None sends a placeholder key.
        max_concurrency: requests in flight at once per server, over all concurrent ``generate`` calls.
        timeout_s: per-request timeout (each attempt).
        max_retries: retries after the first attempt on retryable errors.
        max_tokens: hard cap on generated tokens, whatever the sampling asks for.
        backoff_s: first retry delay; doubles per retry (with jitter), capped at ``backoff_max_s``.
        cooldown_s: how long a failed replica is skipped (doubling per consecutive trip, capped at
            ``backoff_max_s``); only with several servers.
    """

    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str | list[str] | None = None,
        *,
        api_key_env: str | None = None,
        max_concurrency: int = 16,
        timeout_s: float = 60.0,
        max_retries: int = 5,
        max_tokens: int = 128,
        backoff_s: float = 0.5,
        backoff_max_s: float = 30.0,
        cooldown_s: float = 5.0,
    ) -> None:
        super().__init__(model)
        urls = [base_url] if base_url is None or isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("llm: base_url is an empty list")
        self.base_url = base_url
        self.cooldown_s = cooldown_s
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_tokens = max_tokens
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._key = read_api_key(api_key_env)
        self._rng = random.Random()
        self._replicas = [_Replica(url) for url in urls]
        self._next = 0  # where the least-outstanding scan starts: ties rotate over the replicas
        self._waiters: list[asyncio.Future] = []  # requests waiting for a free slot on a live replica
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="curio-openai", daemon=True)
        self._thread.start()
        self.send_seed = True  # a server that crashes on per-request seeds (vLLM on a CPU) turns this off
        self.extra_body: dict[str, Any] = {}  # server-specific request fields (vLLM: return_token_ids)

    # -- sync face -------------------------------------------------------------------------------------------
    def generate(self, conversations: list[Conversation], sampling: Sampling) -> list[Generation]:
        if not conversations:
            return []
        return self.run(self._batch(conversations, sampling))

    def run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the backend's event loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        for replica in self._replicas:
            if replica.client is not None:
                asyncio.run_coroutine_threadsafe(replica.client.close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    # -- async core (runs on the backend's loop) ---------------------------------------------------------------
    def _client(self, replica: _Replica) -> openai.AsyncOpenAI:
        """The replica's client, made on first use (on the backend's loop)."""
        if replica.client is None:
            replica.client = openai.AsyncOpenAI(
                api_key=self._key,
                base_url=replica.url,
                max_retries=0,  # retries are ours: counted, jittered, bounded
                timeout=self.timeout_s,
                http_client=_http_client(self.max_concurrency),
            )
        return replica.client

    async def _batch(self, conversations: list[Conversation], sampling: Sampling) -> list[Generation]:
        for replica in self._replicas:
            self._client(replica)
        results: list[Generation | None] = [None] * len(conversations)
        next_index = iter(range(len(conversations)))

        # A fixed pool of workers instead of one task per item: big batches stay cheap in memory.
        async def worker() -> None:
            for i in next_index:
                results[i] = await self._request(conversations[i], sampling)

        workers = min(self.max_concurrency * len(self._replicas), len(conversations))
        await asyncio.gather(*(worker() for _ in range(workers)))
        return [r for r in results if r is not None]

    def _body(self, conversation: Conversation, sampling: Sampling) -> dict:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": conversation,
            "max_tokens": min(sampling.max_tokens, self.max_tokens),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.seed is not None and self.send_seed:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.min_p > 0:
            body["min_p"] = sampling.min_p  # vLLM / FastChat extension
        if sampling.logprobs:
            body["logprobs"] = True
        return {**body, **self.extra_body}

    # -- replicas: least outstanding, per-replica cap, circuit breaker ---------------------------------------------
    async def _acquire(self) -> _Replica:
        """A slot on the live replica with the fewest requests in flight; waits while all are full or down."""
        while True:
            now = time.monotonic()
            n = len(self._replicas)
            best: _Replica | None = None
            for k in range(n):
                r = self._replicas[(self._next + k) % n]
                # Back from a cool-down: one probe request until it answers again ("half-open").
                cap = 1 if r.trips else self.max_concurrency
                if r.down_until <= now and r.outstanding < cap:
                    if best is None or r.outstanding < best.outstanding:
                        best = r
            if best is not None:
                self._next = (self._next + 1) % n
                best.outstanding += 1
                return best
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            live = [r for r in self._replicas if r.down_until <= now]
            # All down: try again when the first cool-down ends (or earlier, when a slot frees).
            wake = None if live else min(r.down_until for r in self._replicas) - now
            try:
                await asyncio.wait_for(waiter, wake)
            except TimeoutError:
                pass
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def _release(self, replica: _Replica) -> None:
        replica.outstanding -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return

    def _record(self, replica: _Replica, ok: bool, connection_failed: bool = False) -> bool:
        """Update the replica's breaker; True when this failure took it out (its requests go elsewhere)."""
        if ok:
            replica.failures = replica.trips = 0
            return False
        replica.failures += 1
        if len(self._replicas) == 1 or replica.down_until > time.monotonic():
            return replica.down_until > time.monotonic()
        if not connection_failed and replica.failures < TRIP_AFTER:
            return False
        cooldown = min(self.backoff_max_s, self.cooldown_s * 2**replica.trips)
        replica.trips += 1
        replica.down_until = time.monotonic() + cooldown
        log.warning("llm server %s skipped for %.1f s after %d failure(s)", replica.url, cooldown, replica.failures)
        for _ in range(len(self._waiters)):  # waiters may now need to pick another replica or sleep
            self._wake_one()
        return True

    async def _request(self, conversation: Conversation, sampling: Sampling) -> Generation:
        body = self._body(conversation, sampling)
        start = time.monotonic()
        error = ""
        attempt = 0
        while True:
            replica = await self._acquire()
            assert replica.client is not None
            try:
                # asyncio.timeout, not wait_for: no extra task per request. The SDK's generic POST: its auth,
                # headers and error mapping, without typed request/response models (chat.completions.create
                # costs ~1.7x the CPU per request here).
                async with asyncio.timeout(self.timeout_s):
                    data = await replica.client.post("/chat/completions", body=body, cast_to=object)
                generation = parse_completion(data, sampling.logprobs)
                self._record(replica, ok=True)
                generation.meta.update(retries=attempt, latency_s=round(time.monotonic() - start, 4))
                return generation
            except Exception as e:  # noqa: BLE001 - every failure becomes a retry or an error Generation
                retryable, hint, error = self._classify(e)
                failed_over = retryable and self._record(replica, ok=False, connection_failed=_refused(e))
            finally:
                self._release(replica)
            if not retryable or attempt >= self.max_retries:
                break
            if not failed_over:  # a replica taken out: the retry goes to another one (or waits) without backoff
                await asyncio.sleep(self._backoff(attempt, hint))
            attempt += 1
        log.warning("llm request failed for good after %d attempt(s): %s", attempt + 1, error)
        return Generation(
            text="", error=error, meta={"retries": attempt, "latency_s": round(time.monotonic() - start, 4)}
        )

    def _classify(self, e: Exception) -> tuple[bool, float | None, str]:
        """(retryable, server's retry-after hint in seconds, error text without the key)."""
        hint: float | None = None
        if isinstance(e, openai.APIStatusError):
            status = e.status_code
            retryable = status in RETRY_STATUS or status >= 500
            try:
                hint = float(e.response.headers.get("retry-after", ""))
            except ValueError:
                hint = None
            text = f"HTTP {status}: {e.message}"
        elif isinstance(e, asyncio.TimeoutError | TimeoutError):
            retryable, text = True, f"timeout after {self.timeout_s:g} s"
        elif isinstance(e, openai.APIConnectionError):
            # The SDK's aiohttp transport reports a refused connection as a connect *timeout*: look at the root.
            root = _root_cause(e)
            if _refused(e):
                retryable, text = True, f"connection error: {type(root).__name__}: {root}"
            else:
                retryable, text = True, f"timeout after {self.timeout_s:g} s"
        elif isinstance(e, ValueError):  # MalformedResponse, or a body that is not JSON at all
            retryable, text = True, str(e) if isinstance(e, MalformedResponse) else "completion body is not JSON"
        else:
            retryable, text = False, f"{type(e).__name__}: {e}"
        if self._key != NO_KEY:
            text = text.replace(self._key, "***")
        return retryable, hint, text[:500]

    def _backoff(self, attempt: int, hint: float | None) -> float:
        ceiling = min(self.backoff_max_s, self.backoff_s * 2**attempt)
        delay = ceiling / 2 + self._rng.uniform(0, ceiling / 2)  # "equal jitter": never all at once again
        if hint is not None:
            delay = max(delay, min(hint, self.backoff_max_s))
        return delay


def _shard_main(conn: Any, kwargs: dict) -> None:
    """A client process: one OpenAIBackend (its own event loop and connections) answering batches sent over
    ``conn`` as ``(job, conversations, sampling)``; batches run concurrently, each answered ``(job, result)``."""
    backend = OpenAIBackend(**kwargs)
    send_lock = threading.Lock()

    def reply(job: int, future: Any) -> None:
        try:
            result: Any = future.result()
        except BaseException as e:  # noqa: BLE001 - travels back to the caller's generate
            result = RuntimeError(f"openai client process: {type(e).__name__}: {e}")
        with send_lock:
            conn.send((job, result))

    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:
                break
            if message is None:
                break
            job, conversations, sampling = message
            future = asyncio.run_coroutine_threadsafe(backend._batch(conversations, sampling), backend._loop)
            future.add_done_callback(lambda f, job=job: reply(job, f))
    finally:
        backend.close()


class ShardedOpenAIBackend(ChatBackend):
    """``client_processes`` OpenAIBackends in as many processes, for concurrencies one Python core cannot drive
    (the SDK costs ~1 ms of CPU per request: one process tops out near 1,000 requests/s, less while a wave of
    answers queues behind it). Each batch is dealt round-robin over the processes; each has its own event loop,
    connection pool and breaker state, and ``max_concurrency`` per server is split between them, so the total
    in flight per server is still ``max_concurrency``. Answers come back in input order, as from OpenAIBackend.
    Processes start on the first ``generate`` (spawned: ~1 s) and stop on ``close``.
    """

    name = "openai"

    def __init__(self, model: str, base_url: str | list[str] | None = None, *, processes: int = 2,
                 max_concurrency: int = 16, **kwargs: Any) -> None:
        super().__init__(model)
        if processes < 2 or processes > max_concurrency:
            raise ValueError(f"llm: client_processes must be 2..max_concurrency ({max_concurrency}), not {processes}")
        read_api_key(kwargs.get("api_key_env"))  # a missing key is a one-line error here, not in a child
        self.base_url = base_url
        shares = [max_concurrency // processes + (k < max_concurrency % processes) for k in range(processes)]
        self._kwargs = [{"model": model, "base_url": base_url, "max_concurrency": s, **kwargs} for s in shares]
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._jobs = itertools.count()
        self._lock = threading.Lock()  # processes, pending jobs
        self._send_lock = threading.Lock()  # one writer per pipe at a time

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # never fork a process that runs an event-loop thread
        for kwargs in self._kwargs:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_shard_main, args=(child, kwargs), name="curio-openai-client", daemon=True)
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)
            threading.Thread(target=self._receive, args=(parent,), name="curio-openai-shard", daemon=True).start()

    def _receive(self, conn: Any) -> None:
        while True:
            try:
                job, result = conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                future = self._pending.pop(job)
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
        with self._lock:  # the process is gone: whatever it still owed fails loudly
            owed = [f for f in self._pending.values() if not f.done()]
        for future in owed:
            future.set_exception(RuntimeError("openai client process exited"))

    def generate(self, conversations: list[Conversation], sampling: Sampling) -> list[Generation]:
        if not conversations:
            return []
        with self._lock:
            if not self._procs:
                self._start()
            n = len(self._conns)
            jobs = [next(self._jobs) for _ in range(min(n, len(conversations)))]
            futures = [self._pending.setdefault(job, concurrent.futures.Future()) for job in jobs]
        with self._send_lock:  # not under _lock: the receiving threads must keep draining answers meanwhile
            for k, job in enumerate(jobs):
                self._conns[k].send((job, conversations[k::n], sampling))
        out: list[Generation | None] = [None] * len(conversations)
        for k, future in enumerate(futures):
            out[k::n] = future.result()
        return [g for g in out if g is not None]

    def close(self) -> None:
        with self._lock:
            for conn in self._conns:
                try:
                    conn.send(None)
                except OSError:
                    pass
            for proc in self._procs:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.terminate()
            for conn in self._conns:
                conn.close()
            self._conns, self._procs = [], []
