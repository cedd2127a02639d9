"""Deterministic programs behind the chat interface (an engine answering as the environment, test doubles)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline.llm.base import ChatBackend, Conversation, Generation, Sampling

Program = Callable[[Conversation], str]
ProgramFactory = Callable[[Any], Program]  # game (or None) -> program

_PROGRAMS: dict[str, ProgramFactory] = {}


def register_program(name: str) -> Callable[[ProgramFactory], ProgramFactory]:
    """Register ``factory(game) -> program`` under ``name`` (the ``model`` of a rules LLMConfig)."""

    def wrap(factory: ProgramFactory) -> ProgramFactory:
        _PROGRAMS[name] = factory
        return factory

    return wrap


def program_names() -> list[str]:
    """The registered program names (what a rules role's ``model`` may be)."""
    return sorted(_PROGRAMS)


def rules_program(name: str, game: Any = None) -> Program:
    if name not in _PROGRAMS:
        raise KeyError(f"llm: unknown rules program {name!r} (known: {', '.join(sorted(_PROGRAMS))})")
    return _PROGRAMS[name](game)


@register_program("echo")
def _echo(game: Any) -> Program:
    """Answers with the last user message: a zero-cost stand-in for checks and tests."""
    return lambda conversation: next((m["content"] for m in reversed(conversation) if m["role"] == "user"), "")


class RulesBackend(ChatBackend):
    """Answers every conversation with ``program(conversation)``; sampling is ignored."""

    name = "rules"

    def __init__(self, program: Program, model: str = "program") -> None:
        super().__init__(model)
        self.program = program

    def generate(self, conversations: list[Conversation], sampling: Sampling) -> list[Generation]:
        return [Generation(text=self.program(c), meta={"latency_s": 0.0}) for c in conversations]
