"""NetHack annotation: Motif pairwise preferences over captions and ONI per-message labels.

Both take a chat backend (the prompts in ``prompts/``: ``motif.yaml`` which of two captions shows more progress,
``oni.yaml`` is one message helpful, ``goals.yaml`` the goal variants) or the embedding backend (similarity to
the goal's embedding sentence, the no-LLM default). Parse failures never raise: they come back as UNKNOWN with
the raw answer and are counted in the backend's ledger.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Literal

from pipeline.llm.base import ChatBackend, Conversation, Sampling
from pipeline.llm.cache import ask
from pipeline.llm.embedding import EmbeddingBackend
from pipeline.llm.ledger import Ledger, Usage
from pipeline.llm.pairwise import Annotation, ask_pairwise, raw_text
from pipeline.llm.prompts import load_prompt, render

PreferenceLabel = Literal["FIRST", "SECOND", "TIE", "UNKNOWN"]
MessageLabel = Literal["helpful", "unhelpful", "UNKNOWN"]
_prompt = functools.partial(load_prompt, Path(__file__).parent / "prompts")


# -- Motif pairwise preference ------------------------------------------------------------------------------
_PREFERENCE_RE = re.compile(r"best[ _]description[\"']?\s*[:=]\s*[\"']?\s*(1|2|none)\b", re.IGNORECASE)
_PREFERENCE_LABEL: dict[str, PreferenceLabel] = {"1": "FIRST", "2": "SECOND", "none": "TIE"}


def nethack_goals() -> dict[str, dict[str, str]]:
    return _prompt("goals")


def preference_goals() -> list[str]:
    return list(nethack_goals())


def preference_templates() -> list[str]:
    return list(_prompt("motif")["templates"])


def nethack_goal(goal: str) -> dict[str, str]:
    """One goal variant (text, question, embedding sentence); a one-line error for an unknown name."""
    goals = nethack_goals()
    if goal not in goals:
        raise ValueError(f"llm: unknown goal {goal!r} (known: {', '.join(goals)})")
    return goals[goal]


def preference_messages(
    caption_1: str, caption_2: str, goal: str = "defaultgoal", template: str = "default"
) -> Conversation:
    """The Motif-style comparison of two captions for one goal variant and template."""
    p = _prompt("motif")
    if template not in p["templates"]:
        raise ValueError(f"llm: unknown preference template {template!r} (known: {', '.join(p['templates'])})")
    g = nethack_goal(goal)
    user = render(
        p["templates"][template],
        goal_text=g["text"],
        question=g["question"],
        caption_1=caption_1 or p["empty_caption"],
        caption_2=caption_2 or p["empty_caption"],
    )
    return [{"role": "system", "content": render(p["system"])}, {"role": "user", "content": user}]


def parse_preference(text: str) -> PreferenceLabel:
    """FIRST / SECOND / TIE from the last ``("best_description": 1|2|None)`` of the answer, else UNKNOWN."""
    found = _PREFERENCE_RE.findall(text)
    return _PREFERENCE_LABEL[found[-1].lower()] if found else "UNKNOWN"


RETRY_PROMPT: str = _prompt("motif")["retry"].strip()


# -- ONI per-message label ----------------------------------------------------------------------------------
# The tag must close the answer: only trailing whitespace or a full stop may follow it.
_LABEL_RE = re.compile(r"<label>\s*(helpful|unhelpful)\s*</label>[\s.]*\Z", re.IGNORECASE)


def message_label_messages(message: str, goal: str = "defaultgoal") -> Conversation:
    """The ONI-style question "is this one game message helpful?"."""
    p = _prompt("oni")
    user = render(p["user"], goal_text=nethack_goal(goal)["text"], message=message)
    return [{"role": "system", "content": render(p["system"])}, {"role": "user", "content": user}]


def parse_message_label(text: str) -> MessageLabel:
    """helpful / unhelpful only from a final ``<label>…</label>`` tag; UNKNOWN otherwise."""
    found = _LABEL_RE.search(text)
    return found.group(1).lower() if found else "UNKNOWN"  # type: ignore[return-value]


# -- annotation -------------------------------------------------------------------------------------------
# Motif: temperature 0.1, top-p 0.95. The seed makes the answer a function of the prompt, hence cacheable.
PREFERENCE_SAMPLING = Sampling(temperature=0.1, top_p=0.95, max_tokens=512, seed=0)
LABEL_SAMPLING = Sampling(temperature=0.1, top_p=0.95, max_tokens=256, seed=0)


def _ledger(backend: object) -> Ledger | None:
    return getattr(backend, "ledger", None)


def _label_parses(text: str) -> bool:
    return parse_message_label(text) != "UNKNOWN"


def annotate_preferences(
    backend: ChatBackend | EmbeddingBackend,
    pairs: list[tuple[str, str]],
    goal: str = "defaultgoal",
    template: str = "default",
    sampling: Sampling | None = None,
    *,
    tie_margin: float = 1e-3,
) -> list[Annotation]:
    """(label, raw answer, usage) per caption pair: FIRST / SECOND / TIE / UNKNOWN.

    Identical captions are TIE without a call. An unparseable answer gets one retry turn appended; still
    unparseable → UNKNOWN, raw = both answers joined by ``[retry]`` (its usage counts both requests). With the
    embedding backend the caption closer to the goal sentence wins; similarities within ``tie_margin`` are a TIE.
    """
    results: list[Annotation | None] = [None] * len(pairs)
    asked = []
    for i, (a, b) in enumerate(pairs):
        if a.strip() == b.strip():
            results[i] = Annotation("TIE", "")
        else:
            asked.append(i)
    if isinstance(backend, EmbeddingBackend):
        preference_messages("", "", goal, template)  # raises on an unknown goal / template name
        goal_text = nethack_goal(goal)["embedding"]
        s1 = backend.similarity([pairs[i][0] for i in asked], goal_text)
        s2 = backend.similarity([pairs[i][1] for i in asked], goal_text)
        for i, x, y in zip(asked, s1, s2, strict=True):
            label: PreferenceLabel = "TIE" if abs(x - y) <= tie_margin else ("FIRST" if x > y else "SECOND")
            results[i] = Annotation(label, f"similarity 1={x:.4f} 2={y:.4f}")
        return [r for r in results if r is not None]

    asked_conversations = [preference_messages(*pairs[i], goal=goal, template=template) for i in asked]
    got = ask_pairwise(backend, asked_conversations, parse_preference, RETRY_PROMPT,
                       sampling or PREFERENCE_SAMPLING)
    for i, annotation in zip(asked, got, strict=True):
        results[i] = annotation
    return [r for r in results if r is not None]


def label_messages(
    backend: ChatBackend | EmbeddingBackend,
    messages: list[str],
    sampling: Sampling | None = None,
    *,
    goal: str = "defaultgoal",
    threshold: float = 0.2,
) -> list[Annotation]:
    """(label, raw answer, usage) per message: helpful / unhelpful / UNKNOWN.

    Empty messages are unhelpful without a call. Only a final ``<label>…</label>`` tag counts. With the
    embedding backend a message is helpful when its cosine with the goal sentence exceeds ``threshold``
    (with all-MiniLM-L6-v2 and the default goal, "You kill the newt!" scores 0.23, "It's a wall." 0.07).
    """
    results: list[Annotation | None] = [None] * len(messages)
    asked = [i for i, m in enumerate(messages) if m.strip()]
    for i, m in enumerate(messages):
        if not m.strip():
            results[i] = Annotation("unhelpful", "")
    if isinstance(backend, EmbeddingBackend):
        goal_text = nethack_goal(goal)["embedding"]
        sims = backend.similarity([messages[i] for i in asked], goal_text)
        for i, s in zip(asked, sims, strict=True):
            results[i] = Annotation("helpful" if s > threshold else "unhelpful", f"similarity={s:.4f}")
        return [r for r in results if r is not None]

    conversations = [message_label_messages(messages[i], goal=goal) for i in asked]
    unknown = 0
    for i, g in zip(asked, ask(backend, conversations, sampling or LABEL_SAMPLING, _label_parses), strict=True):
        label = parse_message_label(g.text) if g.error is None else "UNKNOWN"
        unknown += label == "UNKNOWN"
        results[i] = Annotation(label, raw_text(g), Usage.of(g))
    ledger = _ledger(backend)
    if ledger is not None:
        ledger.count_unknown(unknown)
    return [r for r in results if r is not None]
