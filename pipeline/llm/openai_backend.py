"""Any OpenAI-compatible chat server (vLLM's server, FastChat, OpenAI) through the official async client.

``generate`` is synchronous: requests run on an event loop owned by the backend (one background thread), so
stages, Prefect tasks and tests call it like any other backend. Concurrency is bounded by one semaphore of
``max_concurrency`` shared by every batch; each request has a timeout; 429 / 5xx / timeouts / connection
errors / malformed bodies are retried with exponential backoff and jitter; a request that fails for good
comes back as ``Generation(text="", error=...)`` instead of raising.

The API key is read from the environment variable *named* in params (``api_key_env``) and lives only in the
client object; error messages are scrubbed of it before they are stored or logged.
"""

from __future__ import annotations

import asyncio
import logging
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


def parse_completion(data: Any, want_logprobs: bool) -> Generation:
    """A chat-completion JSON body → Generation; raises MalformedResponse on anything else."""
    try:
        choice = data["choices"][0]
        text = choice["message"].get("content") or ""
        usage = data.get("usage") or {}
        logprobs = None
        if want_logprobs and choice.get("logprobs"):
            logprobs = [float(t["logprob"]) for t in choice["logprobs"].get("content") or []]
        return Generation(
            text=str(text),
            token_logprobs=logprobs,
            tokens_in=int(usage.get("prompt_tokens") or 0),
            tokens_out=int(usage.get("completion_tokens") or 0),
        )
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
        raise MalformedResponse(f"malformed completion body ({type(e).__name__})") from None


class OpenAIBackend(ChatBackend):
    """Batched chat over HTTP with bounded concurrency, timeouts and retries.

    Args:
        model: the served model name.
        base_url: server URL ending in ``/v1``; None = the SDK default (api.openai.com or $OPENAI_BASE_URL).
        api_key_env: NAME of the environment variable holding the key; None sends a placeholder key.
        max_concurrency: requests in flight at once, over all concurrent ``generate`` calls.
        timeout_s: per-request timeout (each attempt).
        max_retries: retries after the first attempt on retryable errors.
        max_tokens: hard cap on generated tokens, whatever the sampling asks for.
        backoff_s: first retry delay; doubles per retry (with jitter), capped at ``backoff_max_s``.
    """

    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        *,
        api_key_env: str | None = None,
        max_concurrency: int = 16,
        timeout_s: float = 60.0,
        max_retries: int = 5,
        max_tokens: int = 128,
        backoff_s: float = 0.5,
        backoff_max_s: float = 30.0,
    ) -> None:
        super().__init__(model)
        self.base_url = base_url
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_tokens = max_tokens
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._key = read_api_key(api_key_env)
        self._rng = random.Random()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="curio-openai", daemon=True)
        self._thread.start()
        self._client: openai.AsyncOpenAI | None = None
        self._sem: asyncio.Semaphore | None = None

    # -- sync face -------------------------------------------------------------------------------------------
    def generate(self, conversations: list[Conversation], sampling: Sampling) -> list[Generation]:
        if not conversations:
            return []
        return asyncio.run_coroutine_threadsafe(self._batch(conversations, sampling), self._loop).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        if self._client is not None:
            asyncio.run_coroutine_threadsafe(self._client.close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    # -- async core (runs on the backend's loop) ---------------------------------------------------------------
    async def _batch(self, conversations: list[Conversation], sampling: Sampling) -> list[Generation]:
        if self._client is None:
            self._client = openai.AsyncOpenAI(
                api_key=self._key,
                base_url=self.base_url,
                max_retries=0,  # retries are ours: counted, jittered, bounded
                timeout=self.timeout_s,
                http_client=_http_client(self.max_concurrency),
            )
            self._sem = asyncio.Semaphore(self.max_concurrency)
        results: list[Generation | None] = [None] * len(conversations)
        next_index = iter(range(len(conversations)))

        # A fixed pool of workers instead of one task per item: big batches stay cheap in memory.
        async def worker() -> None:
            for i in next_index:
                results[i] = await self._request(conversations[i], sampling)

        await asyncio.gather(*(worker() for _ in range(min(self.max_concurrency, len(conversations)))))
        return [r for r in results if r is not None]

    def _body(self, conversation: Conversation, sampling: Sampling) -> dict:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": conversation,
            "max_tokens": min(sampling.max_tokens, self.max_tokens),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.min_p > 0:
            body["min_p"] = sampling.min_p  # vLLM / FastChat extension
        if sampling.logprobs:
            body["logprobs"] = True
        return body

    async def _request(self, conversation: Conversation, sampling: Sampling) -> Generation:
        assert self._client is not None and self._sem is not None
        body = self._body(conversation, sampling)
        start = time.monotonic()
        error = ""
        attempt = 0
        while True:
            try:
                async with self._sem:
                    # The SDK's generic POST: its auth, headers and error mapping, without building typed
                    # request/response models (chat.completions.create costs ~1.7x the CPU per request here).
                    data = await asyncio.wait_for(
                        self._client.post("/chat/completions", body=body, cast_to=object), timeout=self.timeout_s
                    )
                generation = parse_completion(data, sampling.logprobs)
                generation.meta = {"retries": attempt, "latency_s": round(time.monotonic() - start, 4)}
                return generation
            except Exception as e:  # noqa: BLE001 - every failure becomes a retry or an error Generation
                retryable, hint, error = self._classify(e)
            if not retryable or attempt >= self.max_retries:
                break
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
            if isinstance(root, asyncio.TimeoutError | TimeoutError) or (
                root is e and isinstance(e, openai.APITimeoutError)
            ):
                retryable, text = True, f"timeout after {self.timeout_s:g} s"
            else:
                retryable, text = True, f"connection error: {type(root).__name__}: {root}"
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
