"""Asking a judge which of two things is better, with Motif's discipline, for any track.

Each comparison is one conversation (the track builds it from its own prompt). The answer is parsed by the
track's parser into FIRST / SECOND / TIE or UNKNOWN. An unparseable answer gets one retry turn appended (the
track's retry prompt: "So, which one is the best? …"); still unparseable → UNKNOWN, the raw text being both
answers joined by ``[retry]`` and its usage counting both requests. Answers go through the response cache
(``pipeline.llm.cache.ask``): only parseable answers are kept as answers, and when the retry resolved a
comparison the first answer is kept too, so a rerun replays both without a send. UNKNOWNs are counted in the
backend's ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from pipeline.llm.base import ChatBackend, Conversation, Generation, Sampling
from pipeline.llm.cache import CachedBackend, ask
from pipeline.llm.ledger import Ledger, Usage

UNKNOWN = "UNKNOWN"
RETRY_SEPARATOR = "\n[retry]\n"


class Annotation(NamedTuple):
    """One answer: the parsed label, the raw text (or the failure), what its requests cost."""

    label: str
    raw: str
    usage: Usage = Usage()


def raw_text(g: Generation) -> str:
    return g.text if g.error is None else f"[request failed] {g.error}"


def ask_pairwise(backend: ChatBackend, conversations: list[Conversation], parse: Callable[[str], str],
                 retry_prompt: str, sampling: Sampling) -> list[Annotation]:
    """One Annotation per comparison conversation: ``parse``'s label (UNKNOWN when it finds none)."""

    def parses(text: str) -> bool:
        return parse(text) != UNKNOWN

    first = ask(backend, conversations, sampling, parses)
    results: list[Annotation] = []
    retry: list[int] = []
    for i, g in enumerate(first):
        label = parse(g.text) if g.error is None else UNKNOWN
        results.append(Annotation(label, raw_text(g), Usage.of(g)))
        if label == UNKNOWN and g.error is None and not g.meta.get("given_up"):  # a given-up row stays put
            retry.append(i)
    if retry:
        follow_ups = [[*conversations[i], {"role": "assistant", "content": first[i].text},
                       {"role": "user", "content": retry_prompt}] for i in retry]
        resolved = []
        for i, g in zip(retry, ask(backend, follow_ups, sampling, parses), strict=True):
            label = parse(g.text) if g.error is None else UNKNOWN
            before = results[i]
            results[i] = Annotation(label, before.raw + RETRY_SEPARATOR + raw_text(g), before.usage + Usage.of(g))
            if label != UNKNOWN:
                resolved.append(i)
        if resolved and isinstance(backend, CachedBackend):  # the first answer led to a label: replay it
            backend.keep([conversations[i] for i in resolved], sampling, [first[i] for i in resolved])
    ledger: Ledger | None = getattr(backend, "ledger", None)
    if ledger is not None:
        ledger.count_unknown(sum(a.label == UNKNOWN for a in results))
    return results
