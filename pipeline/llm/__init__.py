"""Chat backends for every LLM role, behind one cache and one ledger per role.

``make_backend(cfg, role=...)`` turns an ``LLMConfig`` from params.yaml into a backend:

- ``hf``: local transformers model (``pipeline.llm.hf.HFBackend``), batched and left-padded.
- ``vllm``: vLLM's OpenAI-compatible server, started from ``make vllm``'s environment or attached to
  (``pipeline.llm.vllm``).
- ``openai``: any OpenAI-compatible server; key from the environment variable named by ``api_key_env``.
- ``rules``: a registered program (``pipeline.llm.rules``).
- ``embedding``: sentence-embedding similarity (``EmbeddingBackend``, not a chat backend).

Chat backends come wrapped in a :class:`CachedBackend`: identical requests are sent once and, when
``cfg.cache`` is on, answers are stored in the shared SQLite cache; ``backend.ledger.metrics()`` is what a
stage adds to its metrics file.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.config import ConfigError
from pipeline.llm.base import ChatBackend, Conversation, Generation, Message, Sampling
from pipeline.llm.cache import CachedBackend, ResponseCache, default_cache_path
from pipeline.llm.config import LLMConfig
from pipeline.llm.embedding import EmbeddingBackend
from pipeline.llm.environment import current_accounting
from pipeline.llm.ledger import Ledger
from pipeline.llm.rules import RulesBackend, rules_program

Backend = ChatBackend | EmbeddingBackend

__all__ = [
    "Backend",
    "CachedBackend",
    "ChatBackend",
    "Conversation",
    "EmbeddingBackend",
    "Generation",
    "Ledger",
    "Message",
    "ResponseCache",
    "Sampling",
    "default_cache_path",
    "make_backend",
    "make_environment",
    "sampling_from_config",
]


def sampling_from_config(cfg: LLMConfig | Any, **overrides: Any) -> Sampling:
    """The Sampling params describe: an LLM role's (``LLMConfig``: temperature, top-p, min-p, max tokens, seed)
    or the policy's (``rollout_text``: no seed, so the samples of one prompt are distinct draws). The one place
    a Sampling is built from params; ``overrides`` replace fields (e.g. an evaluation temperature)."""
    fields = {"temperature": "temperature", "top_p": "top_p", "min_p": "min_p"}
    if isinstance(cfg, LLMConfig):
        fields.update(max_tokens="max_tokens", seed="seed")
    else:
        fields.update(max_tokens="max_new_tokens")
    # an overridden field is not read: a stage that sets its own temperature need not declare the policy's
    values: dict[str, Any] = {k: getattr(cfg, attr) for k, attr in fields.items() if k not in overrides}
    return Sampling(**values, **overrides)


def _inner_backend(cfg: LLMConfig, game: Any) -> ChatBackend:
    if cfg.backend == "hf":
        from pipeline.llm.hf import HFBackend  # torch and transformers: only for an hf backend

        return HFBackend(cfg.model, device=cfg.device, batch_size=cfg.batch_size)
    options = {"api_key_env": cfg.api_key_env, "max_concurrency": cfg.max_concurrency, "timeout_s": cfg.timeout_s,
               "max_retries": cfg.max_retries, "max_tokens": cfg.max_tokens, "backoff_s": cfg.backoff_s}
    if cfg.backend == "vllm":
        from pipeline.llm.vllm import VLLMBackend  # vLLM's server, from its own environment (make vllm)
        from pipeline.models.gguf import resolve_model

        return VLLMBackend(resolve_model(cfg.model), cfg.base_url, device=cfg.device, dtype=cfg.dtype,
                           server_args=tuple(cfg.server_args), **options)
    if cfg.backend == "openai":
        if not cfg.base_url:  # never the SDK's default public endpoint (load_params refuses this too)
            raise ConfigError("llm: the openai backend needs base_url (the server's URL)")
        from pipeline.llm.openai_backend import OpenAIBackend, ShardedOpenAIBackend  # the openai client: when used

        if cfg.client_processes > 1:
            return ShardedOpenAIBackend(cfg.model, cfg.base_url, processes=cfg.client_processes, **options)
        return OpenAIBackend(cfg.model, cfg.base_url, **options)
    if cfg.backend == "rules":
        return RulesBackend(rules_program(cfg.model, game), model=cfg.model)
    raise ValueError(f"llm: backend {cfg.backend!r} is not a chat backend")


def make_backend(
    cfg: LLMConfig,
    *,
    role: str,
    game: Any = None,
    cache: ResponseCache | None = None,
    ledger: Ledger | None = None,
) -> Backend:
    """The backend ``cfg`` selects for ``role`` (the ledger's name).

    Args:
        game: handed to ``rules`` programs that need the game engine.
        cache: the response cache to use; default = the shared file when ``cfg.cache`` is on.
        ledger: share one ledger between backends; default = a new ``Ledger(role)``.
    """
    ledger = ledger or Ledger(role)
    if cfg.backend == "embedding":
        return EmbeddingBackend(cfg.model, device=cfg.device, batch_size=cfg.batch_size, ledger=ledger)
    inner = _inner_backend(cfg, game)
    if cfg.backend == "rules" or not cfg.cache:
        cache = None  # programs cost nothing; dedup and accounting still apply
    elif cache is None:
        cache = ResponseCache()
    return CachedBackend(inner, cache, ledger, max_attempts=cfg.max_attempts)


def make_environment(cfg: LLMConfig, *, game: Any = None, ledger: Ledger | None = None) -> ChatBackend | None:
    """The environment backend for a game: None for ``rules`` (the game's own program answers).

    Inside :func:`pipeline.llm.environment.environment_accounting` the backend is shared by every call with
    the same config (one connection pool, one cache handle) and accounts into the block's ledger, so a stage
    that builds games several times (one set per evaluated policy) reports one ``environment/...`` ledger.
    """
    if cfg.backend == "rules":
        return None
    if cfg.backend == "embedding":
        raise ValueError("llm: rollout_text.environment cannot use the embedding backend")
    scope = current_accounting()
    if scope is not None and ledger is None and game is None:
        return scope.backend(cfg, lambda: make_environment(cfg, ledger=scope.ledger))
    backend = make_backend(cfg, role="environment", game=game, ledger=ledger)
    assert isinstance(backend, ChatBackend)
    return backend
