"""Motif captions: the text an annotator reads for one observation.

A caption is the observation's recent game messages, empty ones dropped and consecutive identical ones grouped
as ``msg (xN)``, one per line. With a window of one step it is just the message (or "" when there is none).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def group_messages(messages: Iterable[str]) -> list[str]:
    """Drop empty messages, then collapse runs of the same message into ``msg (xN)``.

    Empties are dropped first, so a step with no message between two equal ones does not split the run: it
    means nothing new was said, not that something else was.
    """
    lines: list[str] = []
    last, count = None, 0
    for message in messages:
        message = message.strip()
        if not message:
            continue
        if message == last:
            count += 1
            continue
        if last is not None:
            lines.append(last if count == 1 else f"{last} (x{count})")
        last, count = message, 1
    if last is not None:
        lines.append(last if count == 1 else f"{last} (x{count})")
    return lines


def caption(messages: Iterable[str]) -> str:
    return "\n".join(group_messages(messages))


def window_captions(messages: Sequence[str], episodes: np.ndarray, index: np.ndarray, window: int) -> list[str]:
    """Captions of the observations at rows ``index`` of a step table: the ``window`` messages ending at each
    row, never reaching back into the previous episode."""
    if window == 1:
        return [messages[i].strip() for i in index]
    out = []
    for i in index:
        start = max(int(i) - window + 1, 0)
        while episodes[start] != episodes[i]:
            start += 1
        out.append(caption(messages[start : int(i) + 1]))
    return out
