"""SDPA reading shared key / value heads in place gives exactly transformers' own attention, and is taken only in
CPU inference."""

import pytest
import torch
from conftest import assert_same_samples_with_each, grouped_query_llama
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask
from transformers.modeling_utils import AttentionInterface

from pipeline.models.attention import sdpa_attention_gqa


class Module(torch.nn.Module):
    """What the attention functions read from a model's attention layer."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def qkv(batch, q_len, kv_len, heads=6, kv_heads=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, heads, q_len, 8, generator=g), torch.randn(batch, kv_heads, kv_len, 8, generator=g),
            torch.randn(batch, kv_heads, kv_len, 8, generator=g))


HOLES = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1], [1, 1, 1, 1, 0, 1, 1, 1], [0, 0, 0, 1, 0, 0, 1, 1]], dtype=torch.bool)
CASES = {  # (query length, key length, the boolean mask transformers builds, None where SDPA's causal flag does)
    "prefill, left padding": (6, 6, sdpa_mask(3, 6, 6, attention_mask=HOLES[:, 2:])),
    "decode step with a kept cache, holes": (1, 8, sdpa_mask(3, 1, 8, q_offset=7, attention_mask=HOLES)),
    "new tokens after a kept cache": (3, 8, sdpa_mask(3, 3, 8, q_offset=5, attention_mask=HOLES)),
    "no padding: causal flag": (5, 5, None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_in_place_heads_give_the_librarys_numbers(case):
    q_len, kv_len, mask = CASES[case]
    q, k, v = qkv(3, q_len, kv_len)
    module = Module(groups=3)
    with torch.no_grad():
        ours, _ = sdpa_attention_gqa(module, q, k, v, mask, scaling=0.3)
        theirs, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    assert ours.shape == theirs.shape == (3, q_len, 6, 8)
    assert torch.equal(ours, theirs)


def test_the_in_place_path_is_taken_only_without_gradients(monkeypatch):
    """With a padding mask under no_grad torch's SDPA gets the 2 shared heads and ``enable_gqa``; with gradients
    (training) it gets transformers' 6 copied heads, so the backward pass is the library's."""
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, **kwargs):
        seen.append((key.shape[1], kwargs.get("enable_gqa", False)))
        return sdpa(query, key, value, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    q, k, v = qkv(3, 3, 8)
    mask = CASES["new tokens after a kept cache"][2]
    module = Module(groups=3)
    with torch.no_grad():
        sdpa_attention_gqa(module, q, k, v, mask)
    q.requires_grad_(True)
    out, _ = sdpa_attention_gqa(module, q, k, v, mask)
    out.sum().backward()
    assert seen == [(2, True), (6, False)]
    assert q.grad is not None


def test_a_grouped_query_model_generates_the_same_tokens():
    """A Llama with 3 query heads per key / value head, left-padded prompts, sampled: the same tokens and scores
    with the library's SDPA function and with the in-place one (which stays registered, as pipeline.llm.hf has it)."""
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1]])
    ids = mask * torch.randint(3, 120, (3, 7), generator=torch.Generator().manual_seed(1))
    assert_same_samples_with_each(AttentionInterface, (sdpa_attention_forward, sdpa_attention_gqa),
                                  grouped_query_llama(), input_ids=ids, attention_mask=mask, max_new_tokens=10,
                                  pad_token_id=0)
