""""Did you mean ...?" for a mistyped name (a params key, a stage), from difflib's close matches."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def close(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The known names closest to ``name`` (difflib's ratio at least 0.6, and within 0.15 of the best one)."""
    scored = sorted(((difflib.SequenceMatcher(None, name, k).ratio(), k) for k in known), reverse=True)
    scored = [(r, k) for r, k in scored if r >= 0.6]
    return [k for r, k in scored[:n] if r >= scored[0][0] - 0.15] if scored else []


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest known names, or ``""`` when none is close."""
    found = close(name, known)
    return " (did you mean " + " or ".join(repr(c) for c in found) + "?)" if found else ""


def unknown_key_hint(model: type, loc: tuple) -> str:
    """For a key pydantic rejected as unknown at ``loc`` (e.g. ``("games", "max_eval_task")``): the close dotted
    keys of the section it sits in (``" (did you mean 'games.max_eval_tasks'?)"``), or ``""``."""
    from pydantic import BaseModel

    section = model
    for part in loc[:-1]:
        field = section.model_fields.get(str(part))
        sub = field.annotation if field is not None else None
        if not (isinstance(sub, type) and issubclass(sub, BaseModel)):
            return ""
        section = sub
    prefix = "".join(f"{p}." for p in loc[:-1])
    found = close(str(loc[-1]), section.model_fields)
    return " (did you mean " + " or ".join(repr(prefix + c) for c in found) + "?)" if found else ""
