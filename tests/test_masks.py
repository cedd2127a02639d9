"""The broadcast SDPA (and eager) mask builders give exactly transformers' own masks, and models using them generate
the same."""

import pytest
import torch
from conftest import assert_same_samples_with_each
from transformers.masking_utils import (
    and_masks,
    causal_mask_function,
    chunked_causal_mask_function,
    eager_mask,
    packed_sequence_mask_function,
    sdpa_mask,
    sliding_window_causal_mask_function,
)

from pipeline.models import tiny
from pipeline.models.masks import eager_mask_broadcast, sdpa_mask_broadcast


def left_padded(lengths: list[int], width: int) -> torch.Tensor:
    return torch.tensor([[0] * (width - n) + [1] * n for n in lengths], dtype=torch.bool)  # as transformers passes it


def holes() -> torch.Tensor:
    """Rows laid out [pad | reused prefix | pad | new tokens], as the hf backend's kept KV caches make them."""
    rows = [[0, 1, 1, 0, 0, 1, 1, 1], [1, 1, 1, 1, 0, 1, 1, 1], [0, 0, 0, 1, 0, 0, 1, 1]]
    return torch.tensor(rows, dtype=torch.bool)


CASES = {
    "prefill, left padding": dict(batch_size=3, cache_position=torch.arange(6), kv_length=6,
                                  attention_mask=left_padded([6, 4, 1], 6)),
    "decode step, holes": dict(batch_size=3, cache_position=torch.tensor([7]), kv_length=8, attention_mask=holes()),
    "new tokens after a cache, holes": dict(batch_size=3, cache_position=torch.arange(5, 8), kv_length=8,
                                            attention_mask=holes()),
    "offset": dict(batch_size=3, cache_position=torch.arange(6, 8), kv_length=6, kv_offset=2,
                   attention_mask=holes()),
    "no padding, no skip": dict(batch_size=2, cache_position=torch.arange(5), kv_length=5, allow_is_causal_skip=False),
    "packed sequences": dict(batch_size=1, cache_position=torch.arange(7), kv_length=7, allow_is_causal_skip=False,
                             mask_function=and_masks(causal_mask_function, packed_sequence_mask_function(
                                 torch.tensor([[0, 0, 0, 1, 1, 2, 2]])))),
    "sliding window": dict(batch_size=3, cache_position=torch.arange(6), kv_length=6,
                           attention_mask=left_padded([6, 5, 3], 6),
                           mask_function=sliding_window_causal_mask_function(2)),
    "chunked": dict(batch_size=3, cache_position=torch.arange(6), kv_length=6, attention_mask=left_padded([6, 5, 3], 6),
                    mask_function=chunked_causal_mask_function(3, torch.tensor([0, 1, 3]))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_broadcast_mask_equals_the_library_mask(case):
    kwargs = CASES[case]
    ours, theirs = sdpa_mask_broadcast(**kwargs), sdpa_mask(**kwargs)
    assert ours.dtype == torch.bool and ours.shape == theirs.shape
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_broadcast_eager_mask_equals_the_library_mask(case, dtype):
    """Eager attention's float mask (0 where a query attends, the dtype's minimum elsewhere), never skipped."""
    kwargs = CASES[case]
    ours, theirs = eager_mask_broadcast(**kwargs, dtype=dtype), eager_mask(**kwargs, dtype=dtype)
    assert ours.dtype == dtype and ours.shape == theirs.shape
    assert torch.equal(ours, theirs)
    assert set(ours.unique().tolist()) <= {0.0, torch.finfo(dtype).min}


def test_causal_skip_is_kept():
    assert sdpa_mask_broadcast(batch_size=2, cache_position=torch.arange(4), kv_length=4) is None


def test_a_mask_function_for_scalars_only_falls_back_to_the_library():
    def scalar_only(b, h, q, kv):
        return torch.tensor(int(kv) <= int(q))  # int() of a many-element tensor raises

    kwargs = dict(batch_size=2, cache_position=torch.arange(3), kv_length=3, allow_is_causal_skip=False)
    assert torch.equal(sdpa_mask_broadcast(mask_function=causal_mask_function, **kwargs), sdpa_mask(**kwargs))


def test_generation_with_left_padding_is_unchanged():
    """The whole point: a batch of left-padded prompts generates the same tokens with either builder."""
    from transformers.masking_utils import AttentionMaskInterface

    tok = tiny.train_tokenizer(["Is it an animal? <Answer>dog</Answer> yes no maybe the cat sat on a mat"] * 20, 300)
    model = tiny.build_model(tok, n_layer=2, n_embd=32, n_head=2, n_positions=128, seed=0).eval()
    mask = left_padded([9, 5, 2], 9).long()
    ids = mask * torch.randint(7, 200, (3, 9), generator=torch.Generator().manual_seed(0))
    assert_same_samples_with_each(AttentionMaskInterface, (sdpa_mask, sdpa_mask_broadcast), model, input_ids=ids,
                                  attention_mask=mask, max_new_tokens=12, pad_token_id=tok.pad_token_id)
