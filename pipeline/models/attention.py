"""transformers' SDPA attention without copying keys / values per query head, where that gives the same numbers.

SmolLM2 (like most chat models) shares each key / value head among several query heads (grouped-query attention:
9 query heads, 3 key / value heads). transformers passes ``enable_gqa`` to torch's SDPA only on a GPU without a
mask; everywhere else it first copies every key / value head once per query head of its group (``repeat_kv``).
transformers 5 avoids the copy itself for one query token (a decode step: it folds the query heads of a group into
one row each), but still copies for several query tokens under a mask: the new tokens a multi-turn game appends to a
kept cache, and every prompt's prefill. There torch's CPU flash kernel with ``enable_gqa`` reads each query head's
shared key / value head in place, and its output is bit-for-bit the same.

``install()`` registers this function for ``sdpa`` through transformers' ``AttentionInterface`` (its extension
point for attention functions). It takes that path only where it is known to give the library's numbers: on a
CPU, with no gradient being recorded (play, reference log-probs), for more than one query token. Training and every
other device keep transformers' own function, so their backward pass is unchanged.
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import AttentionInterface


def sdpa_attention_gqa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """``transformers.integrations.sdpa_attention.sdpa_attention_forward`` (same arguments, same output), reading
    shared key / value heads in place on a CPU when no gradient is recorded."""
    if (torch.is_grad_enabled() or query.device.type != "cpu" or key.shape[1] == query.shape[1]
            or query.shape[2] == 1 or kwargs.get("output_attentions") or kwargs.get("head_mask") is not None
            or torch.jit.is_tracing()):
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


def install() -> None:
    """Use ``sdpa_attention_gqa`` for every model on SDPA attention in this process."""
    AttentionInterface.register("sdpa", sdpa_attention_gqa)
