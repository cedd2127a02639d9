"""Prompts as data: the YAML templates next to this file, the builders that fill them, and their parsers.

Each parser is strict and returns a canonical label or ``None`` / ``"UNKNOWN"``; callers keep the raw text.

- ``environment.yaml``: PAPRIKA-style LLM host for twenty questions / guess my city (Yes / No / Goal reached).
- ``judge.yaml``: was a claimed win real? (``<VALID>`` / ``<NOTVALID>``).
- ``motif.yaml`` + ``nethack_goals.yaml``: which of two NetHack captions shows more progress.
- ``oni.yaml``: is one NetHack message helpful (final ``<label>…</label>`` tag only).
- ``multiturn_judge.yaml``: interactivity / information gain / accuracy of a forward-simulated continuation.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Literal

import yaml

from pipeline.llm.base import Conversation
from pipeline.multiturn_reward import ACCURACY_SCORES

PROMPT_DIR = Path(__file__).parent

PreferenceLabel = Literal["FIRST", "SECOND", "TIE", "UNKNOWN"]
MessageLabel = Literal["helpful", "unhelpful", "UNKNOWN"]


@functools.cache
def load_prompt(name: str) -> dict[str, Any]:
    """The parsed ``<name>.yaml`` of this directory."""
    path = PROMPT_DIR / f"{name}.yaml"
    if not path.exists():
        raise KeyError(f"llm: no prompt file {path.name}")
    return yaml.safe_load(path.read_text())


def render(template: str, **fields: Any) -> str:
    """Fill ``{name}`` slots; trailing spaces left by empty slots are trimmed."""
    text = template.format_map(fields)
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


# -- LLM environment (twenty questions, guess my city) ------------------------------------------------------
ENVIRONMENT_REPLIES = ("Yes", "No", "Goal reached")
_REPLY_BY_NORM = {r.lower(): r for r in ENVIRONMENT_REPLIES}


def environment_messages(
    secret: str, category: str, history: list[tuple[str, str]], question: str
) -> Conversation:
    """The host's conversation for one question. ``history`` is the (question, reply) pairs so far."""
    p = load_prompt("environment")
    lines = [render(p["history_line"], n=i + 1, question=q, answer=a) for i, (q, a) in enumerate(history)]
    note = p["category_notes"].get(category.strip().lower(), "")
    return [
        {"role": "system", "content": render(p["system"], secret=secret, category=category, category_note=note)},
        {
            "role": "user",
            "content": render(p["user"], history="\n".join(lines) or p["empty_history"], question=question),
        },
    ]


def parse_environment_reply(text: str) -> str | None:
    """ "Yes" / "No" / "Goal reached" when the reply is exactly one of them (case, quotes, markup and end
    punctuation aside); None for anything else, e.g. "Yes, it is." or "Goal reached? No."."""
    norm = re.sub(r"[\s\"'`*_]+", " ", text).strip().rstrip(".!").strip().lower()
    return _REPLY_BY_NORM.get(norm)


def environment_retry() -> str:
    return load_prompt("environment")["retry"]


def environment_default_reply() -> str:
    return load_prompt("environment")["default_reply"]


# -- trajectory judge ---------------------------------------------------------------------------------------
_VERDICT_RE = re.compile(r"<\s*(NOT\s*VALID|VALID)\s*>", re.IGNORECASE)


def judge_messages(
    secret: str, category: str, conversation: Conversation, final_action: str | None, claimed_success: bool
) -> Conversation:
    """The judge's conversation for one finished game (system turns of the game are left out)."""
    p = load_prompt("judge")
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


# -- multi-turn-aware reward judge --------------------------------------------------------------------------
_SCORE_TAGS = ("interactivity", "information_gain")


def _transcript(messages: Conversation, speakers: dict[str, str]) -> str:
    return "\n".join(f"{speakers.get(m['role'], m['role'])}: {m['content']}" for m in messages
                     if m["role"] != "system")


def multiturn_judge_messages(secret: str, category: str, context: Conversation, continuation: Conversation
                             ) -> Conversation:
    """The judge's conversation for one continuation: the game so far (``context``, its system and opening
    messages included or not) and the turns played from there (``continuation``)."""
    p = load_prompt("multiturn_judge")
    speakers = p["speakers"]
    user = render(
        p["user"],
        secret=secret,
        category=category,
        context=_transcript(context, speakers) or p["empty_context"],
        continuation=_transcript(continuation, speakers),
    )
    return [{"role": "system", "content": render(p["system"])}, {"role": "user", "content": user}]


def parse_multiturn_scores(text: str) -> dict[str, float] | None:
    """``{"interactivity", "information_gain", "accuracy"}`` in [0, 1] from the answer's last tag of each kind;
    None when a tag is missing, a score is not a number in [0, 1], or the accuracy label is unknown."""
    scores: dict[str, float] = {}
    for tag in _SCORE_TAGS:
        found = re.findall(rf"<\s*{tag}\s*>\s*([-+0-9.eE]+)\s*<\s*/\s*{tag}\s*>", text, re.IGNORECASE)
        if not found:
            return None
        try:
            value = float(found[-1])
        except ValueError:
            return None
        if not 0.0 <= value <= 1.0:
            return None
        scores[tag] = value
    labels = re.findall(r"<\s*accuracy\s*>(.*?)<\s*/\s*accuracy\s*>", text, re.IGNORECASE | re.DOTALL)
    label = " ".join(re.findall(r"[a-z]+", labels[-1].lower())) if labels else ""
    if label not in ACCURACY_SCORES:
        return None
    scores["accuracy"] = ACCURACY_SCORES[label]
    return scores


# -- Motif pairwise preference ------------------------------------------------------------------------------
_PREFERENCE_RE = re.compile(r"best[ _]description[\"']?\s*[:=]\s*[\"']?\s*(1|2|none)\b", re.IGNORECASE)
_PREFERENCE_LABEL: dict[str, PreferenceLabel] = {"1": "FIRST", "2": "SECOND", "none": "TIE"}


def nethack_goals() -> dict[str, dict[str, str]]:
    return load_prompt("nethack_goals")


def preference_goals() -> list[str]:
    return list(nethack_goals())


def preference_templates() -> list[str]:
    return list(load_prompt("motif")["templates"])


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
    p = load_prompt("motif")
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


RETRY_PROMPT: str = load_prompt("motif")["retry"].strip()


# -- ONI per-message label ----------------------------------------------------------------------------------
# The tag must close the answer: only trailing whitespace or a full stop may follow it.
_LABEL_RE = re.compile(r"<label>\s*(helpful|unhelpful)\s*</label>[\s.]*\Z", re.IGNORECASE)


def message_label_messages(message: str, goal: str = "defaultgoal") -> Conversation:
    """The ONI-style question "is this one game message helpful?"."""
    p = load_prompt("oni")
    user = render(p["user"], goal_text=nethack_goal(goal)["text"], message=message)
    return [{"role": "system", "content": render(p["system"])}, {"role": "user", "content": user}]


def parse_message_label(text: str) -> MessageLabel:
    """helpful / unhelpful only from a final ``<label>…</label>`` tag; UNKNOWN otherwise."""
    found = _LABEL_RE.search(text)
    return found.group(1).lower() if found else "UNKNOWN"  # type: ignore[return-value]
