"""The params of an LLM role (policy, environment, judge, annotator): :class:`LLMConfig`, one per role in
params.yaml, and :func:`llm_roles`, every role of a params tree by its dotted key."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from pipeline.core.config import Section


# -- LLM roles --------------------------------------------------------------------------------------------
class LLMConfig(Section):
    """One LLM role (policy, environment simulator, judge, annotator): which backend and how to sample."""

    backend: Literal["hf", "vllm", "openai", "rules", "embedding"] = Field(
        "rules", description="hf: local transformers; vllm: vLLM's OpenAI-compatible server (started from "
        "`make vllm`'s .venv-vllm for the stage, or base_url's); openai: OpenAI-compatible HTTP server; rules: "
        "deterministic program; embedding: sentence-embedding similarity"
    )
    model: str = Field("", description="HF model id or path, served model name, or rules program name")
    base_url: str | list[str] | None = Field(
        None, description="openai backend: server URL, e.g. http://127.0.0.1:8000/v1, or a list of replicas of one "
        "model (each request goes to the live one with the fewest in flight; a failing one is skipped a while); "
        "vllm backend: a running vLLM server to use (null = start one for the stage)"
    )
    api_key_env: str | None = Field(
        None, description="openai backend: NAME of the environment variable holding the API key (never the key)"
    )
    temperature: float = Field(0.0, ge=0.0, le=5.0, description="sampling temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass")
    min_p: float = Field(0.0, ge=0.0, lt=1.0, description="min-p sampling threshold (hf backend)")
    max_tokens: int = Field(128, ge=1, le=8192, description="cap on generated tokens per request")
    batch_size: int = Field(64, ge=1, description="hf/vllm: conversations per generate call")
    max_concurrency: int = Field(16, ge=1, le=4096, description="openai: concurrent requests in flight per server")
    client_processes: int = Field(
        1, ge=1, le=64, description="openai: client processes the requests are spread over (each with its own "
        "event loop and connections; max_concurrency is shared between them); >1 for hundreds of requests/s, "
        "which one Python core cannot drive (bench/bench_openai.py)")
    timeout_s: float = Field(60.0, gt=0, description="openai: per-request timeout (s)")
    max_retries: int = Field(5, ge=0, le=50, description="openai: retries on 429/5xx/timeouts")
    backoff_s: float = Field(
        0.5, gt=0, le=60, description="openai: first retry delay (s); doubles per retry, with jitter, max 30 s"
    )
    seed: int | None = Field(
        0, description="sampling seed; part of the cache key, so sampled (temperature > 0) answers are cached "
        "too; null = a fresh draw every time (never cached). The role's own: the training `seed` does not move it"
    )
    cache: bool = Field(True, description="use the content-addressed response cache")
    max_attempts: int = Field(
        3, ge=1, le=100, description="times one request is sent, over reruns, while its answer is unparseable "
        "or failed (recorded in the cache); after that it stays UNKNOWN and is not sent again")
    device: str = Field("cpu", description="hf: torch device; vllm: cpu or cuda, the build `make vllm` installed")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="vllm: the served weights' dtype; auto = bfloat16 on a CPU with AVX-512 bf16, float32 on "
        "other CPUs, the model's own on CUDA")
    server_args: list[str] = Field(
        default_factory=list, description="vllm: more arguments for a server started for the stage, e.g. "
        "[--tensor-parallel-size, '2'] (docs/vllm.md)")

    @field_validator("base_url")
    @classmethod
    def _url_scheme(cls, value: str | list[str] | None) -> str | list[str] | None:
        for url in [value] if isinstance(value, str) else value or []:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"base_url {url!r} must start with http:// or https://")
        if isinstance(value, list) and not value:
            raise ValueError("base_url: an empty list (give one URL or several replicas)")
        return value

    @model_validator(mode="after")
    def _processes_share_the_concurrency(self) -> LLMConfig:
        if self.client_processes > self.max_concurrency:
            raise ValueError(f"client_processes ({self.client_processes}) exceeds max_concurrency "
                             f"({self.max_concurrency}): each process needs at least one request in flight")
        return self


def llm_roles(params: BaseModel, prefix: str = "") -> dict[str, LLMConfig]:
    """Every LLMConfig in ``params`` by dotted key (e.g. ``annotate_text.judge``)."""
    found: dict[str, LLMConfig] = {}
    for name in type(params).model_fields:
        value = getattr(params, name)
        if isinstance(value, LLMConfig):
            found[prefix + name] = value
        elif isinstance(value, BaseModel):
            found.update(llm_roles(value, prefix + name + "."))
    return found
