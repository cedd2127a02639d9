"""transformers' SDPA attention without copying keys / values per query head, where that gives the same numbers.

SmolLM2 (like most chat models) shares each key / value head among several query heads (grouped-query attention:
9 query heads, 3 key / value heads). transformers passes ``enable_gqa`` to torch's SDPA only on a GPU without a
mask; everywhere else it first copies every key / value head once per query head of its group (``repeat_kv``):
at every decode step, every prompt's prefill and the new tokens a multi-turn game appends to a kept cache, in every
layer. On a CPU, torch's SDPA with ``enable_gqa`` reads each query head's shared key / value head in place, and its
output is bit-for-bit the same (the copies were 12 % of SmolLM2's play time at a batch of 64).

Padding-free training (bootstrap's batches: the batch's conversations packed into one row, TRL's collator passing
their boundaries as ``cu_seq_lens_q``) gets the same treatment. There transformers builds one mask over the whole
row, block-diagonal and causal, and torch's CPU kernel computes every query against every key of the row, masked or
not: for 16 conversations of about 66 tokens, 16 times the scores that count. On a CPU this function instead runs
SDPA's causal kernel on each conversation by itself (what a varlen flash-attention kernel does on a GPU). Each
score, softmax and weighted sum is the same up to float rounding, and no token attends across conversations.

``install()`` registers this function for ``sdpa`` through transformers' ``AttentionInterface`` (its extension
point for attention functions). The in-place heads are taken only where they are known to give the library's
numbers: on a CPU, with no gradient being recorded (play, reference log-probs). The per-conversation path is
taken only on a CPU for a packed row whose boundaries the collator passed. Everything else keeps transformers' own
function.
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.modeling_utils import AttentionInterface


def sdpa_attention_gqa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """``transformers.integrations.sdpa_attention.sdpa_attention_forward`` (same arguments, same output), reading
    shared key / value heads in place on a CPU when no gradient is recorded, and a packed row one conversation at
    a time."""
    bounds = packed_bounds(query, key, kwargs)
    if bounds is not None and is_causal is not False and getattr(module, "is_causal", True):
        return packed_sdpa(module, query, key, value, bounds, dropout=dropout, scaling=scaling), None
    if (torch.is_grad_enabled() or query.device.type != "cpu" or key.shape[1] == query.shape[1]
            or kwargs.get("output_attentions") or kwargs.get("head_mask") is not None or torch.jit.is_tracing()):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if attention_mask is not None and attention_mask.ndim == 4:
        attention_mask = attention_mask[:, :, :, : key.shape[-2]]
    if is_causal is None:
        is_causal = query.shape[2] > 1 and attention_mask is None and getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=is_causal,
                                                           enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def packed_bounds(query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> list[int] | None:
    """The conversations' start offsets (and the row's end) of a padding-free row on a CPU, else None: one row, no
    cache (keys as long as queries), boundaries covering the row, no sliding window, head mask or attention output
    asked for."""
    cu = kwargs.get("cu_seq_lens_q")
    if (cu is None or query.device.type != "cpu" or query.shape[0] != 1 or key.shape[2] != query.shape[2]
            or kwargs.get("output_attentions") or kwargs.get("sliding_window")
            or kwargs.get("head_mask") is not None or torch.jit.is_tracing()):
        return None
    bounds = [int(x) for x in cu.tolist()]
    if bounds[0] != 0 or bounds[-1] != query.shape[2] or not torch.equal(cu, kwargs.get("cu_seq_lens_k", cu)):
        return None
    return bounds


def packed_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                bounds: list[int], dropout: float = 0.0, scaling: float | None = None) -> torch.Tensor:
    """Causal SDPA over each conversation ``bounds`` delimits in a one-row packed batch, concatenated back in
    transformers' layout (batch, tokens, heads, head size)."""
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    parts = [torch.nn.functional.scaled_dot_product_attention(
        query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], dropout_p=dropout, scale=scaling, is_causal=True)
        for a, b in zip(bounds[:-1], bounds[1:], strict=False) if b > a]
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous()


def install() -> None:
    """Use ``sdpa_attention_gqa`` for every model on SDPA attention in this process."""
    AttentionInterface.register("sdpa", sdpa_attention_gqa)
