"""transformers' SDPA attention mask, built by broadcasting instead of ``torch.vmap``.

transformers (4.5x, torch >= 2.6) builds every 4D boolean mask by vmapping its mask functions (causal, padding,
packed sequences, sliding windows) over batch, head, query and key indices. On a CPU with a small model that
costs more than the attention itself: a decode step with left padding spent ~40 % of its time in the vmap
machinery, and a padding-free training step ~6 %. The mask functions are elementwise tensor expressions, so
calling them once on broadcastable index tensors gives the same booleans. ``install()`` registers this builder
for ``sdpa`` through transformers' ``AttentionMaskInterface`` (its extension point for mask creation), and its float
form for ``eager`` (what the hf backend plays bfloat16 weights with on a CPU); a mask function that cannot be
broadcast falls back to the library's own builder.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.masking_utils import (
    AttentionMaskInterface,
    _ignore_causal_mask_sdpa,
    and_masks,
    causal_mask_function,
    padding_mask_function,
    prepare_padding_mask,
    sdpa_mask,
)


def sdpa_mask_broadcast(
    batch_size: int,
    cache_position: torch.Tensor,
    kv_length: int,
    kv_offset: int = 0,
    mask_function: Callable = causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    allow_is_causal_skip: bool = True,
    **kwargs,
) -> torch.Tensor | None:
    """``transformers.masking_utils.sdpa_mask`` (same arguments, same result): a (batch, 1, query, key) boolean
    mask, or None where SDPA's ``is_causal`` does the job."""
    q_length = cache_position.shape[0]
    padding_mask = prepare_padding_mask(attention_mask, kv_length, kv_offset, _slice=False)
    if allow_is_causal_skip and _ignore_causal_mask_sdpa(padding_mask, q_length, kv_length, kv_offset, local_size):
        return None
    fn = mask_function if padding_mask is None else and_masks(mask_function, padding_mask_function(padding_mask))
    device = cache_position.device
    batch = torch.arange(batch_size, device=device).view(-1, 1, 1, 1)
    head = torch.zeros(1, dtype=torch.long, device=device).view(1, 1, 1, 1)
    query = cache_position.view(1, 1, -1, 1)
    key = (torch.arange(kv_length, device=device) + kv_offset).view(1, 1, 1, -1)
    shape = (batch_size, 1, q_length, kv_length)
    try:
        mask = fn(batch, head, query, key)
        ok = (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.dim() == 4
              and torch.broadcast_shapes(mask.shape, shape) == shape)
    except (RuntimeError, TypeError, IndexError):  # a mask function written for scalar indices only
        ok = False
    if not ok:
        return sdpa_mask(batch_size, cache_position, kv_length, kv_offset, mask_function, attention_mask,
                         local_size=local_size, allow_is_causal_skip=allow_is_causal_skip, **kwargs)
    return mask.expand(shape).contiguous()  # materialised, as the library's: callers may write into it


def eager_mask_broadcast(*args, dtype: torch.dtype = torch.float32, **kwargs) -> torch.Tensor:
    """``transformers.masking_utils.eager_mask`` (same arguments, same result): the boolean mask above, always
    built (eager attention has no causal flag), as 0 where a query attends and the dtype's minimum elsewhere."""
    kwargs.pop("allow_torch_fix", None)
    mask = sdpa_mask_broadcast(*args, **{**kwargs, "allow_is_causal_skip": False})
    return torch.where(mask, torch.tensor(0.0, device=mask.device, dtype=dtype), torch.finfo(dtype).min)


def install() -> None:
    """Use the broadcast builders for every model on SDPA or eager attention in this process."""
    AttentionMaskInterface.register("sdpa", sdpa_mask_broadcast)
    AttentionMaskInterface.register("eager", eager_mask_broadcast)
