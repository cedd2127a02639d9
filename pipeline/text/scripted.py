"""A model-free stand-in policy: each game's scripted player (the one ``bootstrap`` learns from) at a noise level.

Selected with ``policy.backend: scripted`` and ``policy.model: scripted:NOISE`` (``scripted`` = noise 0.3).
It answers through the same ``ChatBackend`` interface as a model, so rollout / evaluation code runs unchanged;
it is for benchmarks and tests of task selection, pairing and evaluation where a policy that sometimes wins
in a varying number of turns matters more than a learned one (training stages need a real model).

The scripted player only reads what the agent is shown (the prompts and the replies so far). Randomness is
drawn from torch's generator, which ``play_episodes`` seeds, so play is as reproducible as a sampled model's.
"""

from __future__ import annotations

import random

import torch

from pipeline.envs.base import Game, Task, extract_answer, format_answer
from pipeline.llm.base import ChatBackend, Conversation, Generation, Sampling
from pipeline.text.config import DEFAULT_NOISE


class ScriptedPolicy(ChatBackend):
    name = "scripted"

    def __init__(self, games: list[Game], noise: float = DEFAULT_NOISE) -> None:
        super().__init__(f"scripted:{noise}")
        self.noise = noise
        self.games = games
        self._known: dict[tuple[str, str], tuple[Game, Task]] = {}

    def _lookup(self, conversation: Conversation) -> tuple[Game, Task]:
        key = (conversation[0]["content"], conversation[1]["content"])
        if key not in self._known:
            for game in self.games:
                for task in game.tasks("train") + game.tasks("eval"):
                    start = game.conversation_start(task)
                    self._known.setdefault((start[0]["content"], start[1]["content"]), (game, task))
        if key not in self._known:
            raise KeyError(f"scripted policy: no game of {[g.name for g in self.games]} opens with "
                           f"{key[1][:60]!r}")
        return self._known[key]

    def generate(self, conversations: list[Conversation], sampling: Sampling) -> list[Generation]:
        out = []
        for conv in conversations:
            game, task = self._lookup(conv)
            rest = conv[2:]
            history = [(extract_answer(m["content"]) or "", rest[i + 1]["content"])
                       for i, m in enumerate(rest) if m["role"] == "assistant" and i + 1 < len(rest)]
            rng = random.Random(int(torch.randint(0, 2**31 - 1, (1,)).item()))
            out.append(Generation(text=format_answer(game.scripted_action(task, history, rng, self.noise))))
        return out
