"""Chat-template facts Curio needs from any HF tokenizer, derived from its own template (no per-family code).

Which tokens count (SFT loss, reference and policy log-probs in reflogprobs / DPO): each assistant turn's
content and the template's end-of-turn token after it, when that token is what stops generation (the model
samples it, so a turn's probability includes it and SFT teaches the model to stop). Never counted: system /
user / environment turns, the role header before the content, and separators after the end-of-turn token
(e.g. ChatML's newline after ``<|im_end|>``). PAPRIKA built a mask of assistant tokens but summed over all
template tokens (RECIPES.md, known bugs); here no template token counts except the one the model emits to stop.

Where the template marks assistant text with ``{% generation %}`` (as the built-in model's does, content and
end-of-turn token inside), the tokenizer's own ``return_assistant_tokens_mask`` — the mechanism TRL's
``assistant_only_loss`` uses — gives the mask. Otherwise each assistant turn is located by rendering growing
prefixes of the conversation with the tokenizer's own template: the turn is what message k adds to the render
of messages[:k]; its header and footer are found by rendering a sentinel in its place. This needs a
prefix-preserving template (every template family in use is; a ValueError says so otherwise). A token that
straddles the edge of the content (a BPE merge across the template's text and the content) counts.
"""

from __future__ import annotations

import logging
import re

from pipeline.models.tiny import PromptEncoder

log = logging.getLogger(__name__)

_SENTINEL = "CURIO7SENTINEL3Q"
_PROBE = [{"role": "user", "content": "x"}]


def has_generation_markers(tokenizer) -> bool:
    template = tokenizer.chat_template or ""
    if isinstance(template, dict):
        template = template.get("default", "")
    return re.search(r"\{%-?\s*generation\s*-?%\}", template) is not None


def _render(tokenizer, messages: list[dict], generation_prompt: bool = False) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def _is_special(tokenizer, token_id: int) -> bool:
    added = tokenizer.added_tokens_decoder.get(token_id)
    return token_id in tokenizer.all_special_ids or (added is not None and added.special)


def _turn_frame(tokenizer, history: list[dict]) -> tuple[str, str]:
    """(text before, text after) the content of an assistant turn that follows ``history``: everything the
    template renders up to and including the turn's header, and its footer (plus any end-of-conversation text)."""
    probe = _render(tokenizer, history + [{"role": "assistant", "content": _SENTINEL}])
    if probe.count(_SENTINEL) != 1:
        raise ValueError("chat template does not render an assistant message's content once: cannot locate "
                         "assistant turns")
    before, after = probe.split(_SENTINEL)
    return before, after


def end_of_turn_id(tokenizer) -> int | None:
    """The token the template puts right after an assistant turn's content, when it is a special token (ChatML
    ``<|im_end|>``, Llama-3 ``<|eot_id|>``, Gemma ``<end_of_turn>``, Phi-3 ``<|end|>``, Mistral ``</s>``); None
    when the template has no such token (a plain-text template ends turns with EOS)."""
    cached = getattr(tokenizer, "_curio_end_of_turn", None)
    if cached is not None and cached[0] == tokenizer.chat_template:
        return cached[1]
    eot = None
    if tokenizer.chat_template:
        _, footer = _turn_frame(tokenizer, _PROBE)
        ids = tokenizer(footer, add_special_tokens=False)["input_ids"] if footer else []
        if ids and _is_special(tokenizer, ids[0]):
            eot = ids[0]
    tokenizer._curio_end_of_turn = (tokenizer.chat_template, eot)  # rendering is not free; per template
    return eot


def stop_token_ids(tokenizer) -> list[int]:
    """Token ids that end a generated turn: the template's end-of-turn token and the tokenizer's EOS."""
    ids = {end_of_turn_id(tokenizer), tokenizer.eos_token_id}
    return sorted(i for i in ids if isinstance(i, int) and i >= 0 and i != tokenizer.unk_token_id)


def assistant_token_mask(tokenizer, messages: list[dict], count_from: int = 0
                         ) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """Token ids of the rendered conversation, the mask of the tokens that count (see module doc) and, when the
    mask was derived from the text (no generation markers), each token's character offsets (else []).

    Only assistant turns from message ``count_from`` on count: a preference pair's prompt may hold the agent's
    earlier turns (a multi-turn state), which are context there, not part of the completion."""
    if has_generation_markers(tokenizer):
        enc = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        ids, mask = list(enc["input_ids"]), [int(m) for m in enc["assistant_masks"]]
        if any(m["role"] == "assistant" for m in messages[:count_from]):
            # the markers mark every assistant turn: uncount those of the first messages, which render (the
            # template being prefix-preserving) as the first tokens of the conversation with the same mask
            head = tokenizer.apply_chat_template(messages[:count_from], tokenize=True, return_dict=True,
                                                 return_assistant_tokens_mask=True)
            if ids[: len(head["input_ids"])] != list(head["input_ids"]):
                raise ValueError("chat template does not render the first messages as a prefix of the "
                                 "conversation: cannot tell their assistant turns from the later ones")
            mask = [0 if i < len(head["assistant_masks"]) and head["assistant_masks"][i] else m
                    for i, m in enumerate(mask)]
        return ids, mask, []
    if not tokenizer.is_fast:
        raise ValueError("assistant masks without {% generation %} markers need a fast tokenizer (offsets)")
    text = _render(tokenizer, messages)
    spans: list[tuple[int, int]] = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant" or k < count_from:
            continue
        before, after = _turn_frame(tokenizer, messages[:k])
        upto = _render(tokenizer, messages[: k + 1])
        start, end = len(before), len(upto) - len(after)
        if not (upto.startswith(before) and upto.endswith(after) and start <= end and text.startswith(upto[:end])):
            raise ValueError("chat template is not prefix-preserving (a later turn re-renders an earlier one): "
                             "cannot locate assistant turns")
        spans.append((start, end))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    eot = end_of_turn_id(tokenizer)
    mask = [0] * len(ids)
    for start, end in spans:
        for i, (s, e) in enumerate(offsets):
            if s < end and e > start:
                mask[i] = 1
            elif s >= end:  # the first token after the content: counts if it is the end-of-turn token
                if ids[i] == eot and s == end:
                    mask[i] = 1
                break
    return ids, mask, offsets


def prompt_boundary(tokenizer, prompt: list[dict], conversation: list[dict], ids: list[int], mask: list[int],
                    offsets: list[tuple[int, int]]) -> int:
    """How many of the tokens ``ids`` of ``conversation`` (from ``assistant_token_mask``) render its first
    messages ``prompt``: those inside the text the prompt's own render shares with the conversation's (a template
    may close a conversation with text that is not there mid-conversation, e.g. Phi-3's EOS). ValueError if a
    counted token would fall in the prompt."""
    if not offsets:
        prompt_ids = tokenizer.apply_chat_template(prompt, tokenize=True, return_dict=False)
        if ids[: len(prompt_ids)] != list(prompt_ids):
            raise ValueError("chat template does not render the prompt as a prefix of the conversation")
        n = len(prompt_ids)
    else:
        text, full = _render(tokenizer, prompt), _render(tokenizer, conversation)
        shared = 0
        while shared < min(len(text), len(full)) and text[shared] == full[shared]:
            shared += 1
        n = sum(1 for _, e in offsets if e <= shared)
    if any(mask[:n]):
        raise ValueError("chat template renders part of an assistant turn inside the prompt")
    return n


def fit_context(tokenizer, messages: list[dict], max_tokens: int) -> tuple[list[dict], int]:
    """``messages`` without their oldest turns so the generation prompt fits ``max_tokens``; returns (messages,
    number of messages dropped). The leading system message and the first user (task) message are always kept;
    turns are dropped in assistant/user pairs so roles keep alternating. If even the kept head and the last
    message do not fit, they are returned as they are (the caller decides)."""
    def length(msgs: list[dict]) -> int:
        return len(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False))

    if length(messages) <= max_tokens:
        return messages, 0
    head = 1 if messages and messages[0]["role"] == "system" else 0
    if head < len(messages) and messages[head]["role"] == "user":
        head += 1
    rest = messages[head:]
    dropped = 0
    while len(rest) > 2 and length(messages[:head] + rest) > max_tokens:
        rest, dropped = rest[2:], dropped + 2
    return messages[:head] + rest, dropped


def continue_prompt(tokenizer, conversation: list[dict], reply_at: int, prompt: list[int],
                    sampled: list[int]) -> list[int] | None:
    """Token in, token out: the generation prompt of ``conversation`` (which goes on past the assistant message at
    ``reply_at`` with the environment's messages) as the ids played so far, ``prompt`` then the ``sampled`` reply,
    followed by what the chat template renders after that reply: the end of its turn (its end-of-turn token unless
    the reply sampled it) and the next messages with the generation prompt. The reply's text is never tokenized
    again. None when the template renders the later conversation without the earlier one as a prefix."""
    before_reply = conversation[:reply_at]
    with_reply = _render(tokenizer, conversation[: reply_at + 1])
    full = _render(tokenizer, conversation, generation_prompt=True)
    _, footer = _turn_frame(tokenizer, before_reply)
    if not full.startswith(with_reply) or not with_reply.endswith(footer):
        return None
    footer_ids = tokenizer(footer, add_special_tokens=False)["input_ids"] if footer else []
    if sampled and footer_ids and sampled[-1] == footer_ids[0]:
        footer_ids = footer_ids[1:]
    rest = full[len(with_reply):]
    rest_ids = tokenizer(rest, add_special_tokens=False)["input_ids"] if rest else []
    return list(prompt) + list(sampled) + list(footer_ids) + list(rest_ids)


def encode_prompt(tokenizer, conversation: list[dict], max_positions: int, max_new_tokens: int) -> list[int]:
    """Generation-prompt token ids of ``conversation``, its oldest turns dropped (logged, never the system / task
    message) when it would leave fewer than ``max_new_tokens`` of a ``max_positions`` context (0 = no limit)."""
    fast = PromptEncoder.of(tokenizer)  # the built-in template, without a Jinja render every turn
    ids = fast(conversation) if fast is not None else None
    if ids is None:
        ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_dict=False)
    budget = max_positions - max_new_tokens if max_positions else 0
    if budget > 0 and len(ids) > budget:
        fitted, dropped = fit_context(tokenizer, conversation, budget)
        if dropped:
            log.warning("conversation of %d messages exceeds the context (%d tokens, %d kept for the answer): "
                        "dropped its %d oldest turns, kept the system / task message",
                        len(conversation), max_positions, max_new_tokens, dropped)
            ids = tokenizer.apply_chat_template(fitted, add_generation_prompt=True, return_dict=False)
    if max_positions and len(ids) >= max_positions:
        raise ValueError(f"the system / task message and last turn alone take {len(ids)} tokens, the model's "
                         f"context is {max_positions}")
    return ids
