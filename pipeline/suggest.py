""""Did you mean ...?" for a mistyped name (a params key, a stage), from difflib's close matches."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, known: Iterable[str], n: int = 3) -> str:
    """``" (did you mean 'x'?)"`` for the closest known names, or ``""`` when none is close."""
    close = difflib.get_close_matches(name, list(known), n=n, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"


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
    close = difflib.get_close_matches(str(loc[-1]), list(section.model_fields), n=3, cutoff=0.6)
    return " (did you mean " + " or ".join(repr(prefix + c) for c in close) + "?)" if close else ""
