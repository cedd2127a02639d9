"""Trajectory judges: was a claimed success real? ``rules`` = a program check, otherwise an LLM prompt
(``prompts/judge.yaml``).

A game that was not claimed as won is NOTVALID without asking anyone (judges only confirm wins). An LLM
answer without a final ``<VALID>`` / ``<NOTVALID>`` tag is UNKNOWN, its raw text kept.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipeline.envs.base import Game, Task, make_game
from pipeline.llm import make_backend, sampling_from_config
from pipeline.llm.base import ChatBackend, Conversation, Sampling
from pipeline.llm.cache import ask
from pipeline.llm.config import LLMConfig
from pipeline.llm.ledger import Ledger, Usage
from pipeline.llm.prompts import load_prompt, render
from pipeline.text.config import RULES_MODELS

RULES_JUDGES = RULES_MODELS["annotate_text.judge"]
_TASK_FIELDS = {f.name for f in dataclasses.fields(Task)}
_prompt = functools.partial(load_prompt, Path(__file__).parent / "prompts")
_VERDICT_RE = re.compile(r"<\s*(NOT\s*VALID|VALID)\s*>", re.IGNORECASE)


def judge_messages(
    secret: str, category: str, conversation: Conversation, final_action: str | None, claimed_success: bool
) -> Conversation:
    """The judge's conversation for one finished game (system turns of the game are left out)."""
    p = _prompt("judge")
    speakers = p["speakers"]
    transcript = "\n".join(
        f"{speakers.get(m['role'], m['role'])}: {m['content']}" for m in conversation if m["role"] != "system"
    )
    user = render(
        p["user"],
        secret=secret,
        category=category,
        claimed="yes" if claimed_success else "no",
        final_action=final_action if final_action is not None else "(none)",
        transcript=transcript,
    )
    return [{"role": "system", "content": render(p["system"])}, {"role": "user", "content": user}]


def parse_verdict(text: str) -> Literal["VALID", "NOTVALID"] | None:
    """The last ``<VALID>`` / ``<NOTVALID>`` tag of the answer; None when there is none."""
    tags = _VERDICT_RE.findall(text)
    if not tags:
        return None
    return "VALID" if re.sub(r"\s", "", tags[-1]).upper() == "VALID" else "NOTVALID"


@dataclass
class JudgeItem:
    """One finished episode: its task row (``Task.to_row()``), the agent's conversation, its final action."""

    task: dict
    conversation: list[dict]
    final_action: str | None
    claimed_success: bool


@dataclass
class Verdict:
    label: Literal["VALID", "NOTVALID", "UNKNOWN"]
    raw: str
    usage: Usage = Usage()  # what asking cost (nothing for a program's verdict or a win never claimed)


class Judge:
    """``judge(items)`` → one Verdict per item; ``ledger`` counts what it cost."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def judge(self, items: list[JudgeItem]) -> list[Verdict]:
        raise NotImplementedError

    @property
    def owns_process(self) -> bool:
        """Whether its backend runs a server of its own (vllm), stopped when the judge is dropped."""
        return bool(getattr(getattr(self, "backend", None), "owns_process", False))

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the backend."""


class ExactMatchJudge(Judge):
    """VALID iff the win was claimed and the game's own ``is_correct_guess`` accepts the final action. Another
    project's environment (``textarena:``, ``openenv:``) is its own judge: a win is its reward at the end of the
    episode (``pipeline.envs.external``), so the label is that outcome."""

    def __init__(self, ledger: Ledger | None = None) -> None:
        super().__init__(ledger or Ledger("judge"))
        self._games: dict[str, Game] = {}

    def _game(self, group: str) -> Game:
        if group not in self._games:
            self._games[group] = make_game(group)
        return self._games[group]

    def judge(self, items: list[JudgeItem]) -> list[Verdict]:
        self.ledger.record_batch(requests=len(items), unique=len(items))
        verdicts = []
        for item in items:
            if not item.claimed_success or item.final_action is None:
                verdicts.append(Verdict("NOTVALID", "exact_match: not claimed"))
                continue
            task = Task(**{k: v for k, v in item.task.items() if k in _TASK_FIELDS})
            if self._game(task.group).env_kind == "external":
                verdicts.append(Verdict("VALID", "exact_match: the environment's reward won the episode"))
                continue
            try:
                correct = self._game(task.group).is_correct_guess(task, item.final_action)
            except NotImplementedError as e:
                self.ledger.count_unknown()
                verdicts.append(Verdict("UNKNOWN", f"exact_match: {e}"))
                continue
            verdicts.append(Verdict("VALID" if correct else "NOTVALID", f"exact_match: {bool(correct)}"))
        return verdicts


class LLMJudge(Judge):
    """Asks a chat backend with the judge prompt; the secret is ``task["env"]``, the category ``task["agent"]``."""

    def __init__(self, backend: ChatBackend, sampling: Sampling, ledger: Ledger | None = None) -> None:
        super().__init__(ledger or getattr(backend, "ledger", None) or Ledger("judge"))
        self.backend = backend
        self.sampling = sampling

    def judge(self, items: list[JudgeItem]) -> list[Verdict]:
        verdicts: list[Verdict | None] = [None] * len(items)
        asked = [i for i, it in enumerate(items) if it.claimed_success]
        for i, it in enumerate(items):
            if not it.claimed_success:
                verdicts[i] = Verdict("NOTVALID", "")
        conversations = [
            judge_messages(
                str(items[i].task.get("env", "")),
                str(items[i].task.get("agent", "")),
                items[i].conversation,
                items[i].final_action,
                True,
            )
            for i in asked
        ]
        answers = ask(self.backend, conversations, self.sampling, lambda text: parse_verdict(text) is not None)
        for i, g in zip(asked, answers, strict=True):
            label = parse_verdict(g.text) if g.error is None else None
            if label is None:
                self.ledger.count_unknown()
                verdicts[i] = Verdict("UNKNOWN", g.text if g.error is None else f"[request failed] {g.error}",
                                      Usage.of(g))
            else:
                verdicts[i] = Verdict(label, g.text, Usage.of(g))
        return [v for v in verdicts if v is not None]

    def close(self) -> None:
        self.backend.close()


def make_judge(cfg: LLMConfig) -> Judge:
    """The judge configured in params: ``rules``/``exact_match`` or any chat backend."""
    if cfg.backend == "rules":
        if cfg.model not in RULES_JUDGES:
            raise ValueError(f"llm: unknown rules judge {cfg.model!r} (known: {', '.join(RULES_JUDGES)})")
        return ExactMatchJudge(Ledger("judge"))
    if cfg.backend == "embedding":
        raise ValueError("llm: the embedding backend cannot judge trajectories; use rules, hf, vllm or openai")
    backend = make_backend(cfg, role="judge")
    return LLMJudge(backend, sampling_from_config(cfg))  # type: ignore[arg-type]
