"""One interface for every LLM role: batched chat generation (+ token log-probs where available)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

Message = dict[str, str]  # {"role": ..., "content": ...}
Conversation = list[Message]


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters of one request; part of the cache key."""

    temperature: float = 0.0
    top_p: float = 1.0
    min_p: float = 0.0
    max_tokens: int = 128
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    #: None: the truncation the model's generation config adds (transformers' top-k 50, its min-p) applies as
    #: ``generate`` applies it; 0 or more: this request says all of it (0 = no top-k, and top_p / min_p alone), as
    #: online RL's rounds sample (``rl_text.sampling``)
    top_k: int | None = None

    def key(self) -> dict:
        if self.top_k is not None:  # only then: the keys of every request that leaves it unset stay as they were
            return {**self._key(), "top_k": self.top_k}
        return self._key()

    def _key(self) -> dict:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "stop": list(self.stop),
            "logprobs": self.logprobs,
        }


@dataclass
class Generation:
    text: str
    token_logprobs: list[float] | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    cached: bool = False
    error: str | None = None  # set when the request failed for good (text is then "")
    meta: dict = field(default_factory=dict)


class ChatBackend(ABC):
    """Batched chat generation. Implementations must return one Generation per conversation, in order."""

    name: str = "backend"

    def __init__(self, model: str = "") -> None:
        self.model = model

    @abstractmethod
    def generate(self, conversations: list[Conversation], sampling: Sampling) -> list[Generation]:
        ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (servers, GPU memory)."""
