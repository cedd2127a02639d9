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
        decode_q, decode_k, decode_v = qkv(3, 1, 8)  # a decode step: one query token on a kept cache
        sdpa_attention_gqa(module, decode_q, decode_k, decode_v, CASES["decode step with a kept cache, holes"][2])
    q.requires_grad_(True)
    out, _ = sdpa_attention_gqa(module, q, k, v, mask)
    out.sum().backward()
    assert seen == [(2, True), (2, True), (6, False)]
    assert q.grad is not None


def test_a_grouped_query_model_generates_the_same_tokens():
    """A Llama with 3 query heads per key / value head, left-padded prompts, sampled: the same tokens and scores
    with the library's SDPA function and with the in-place one (which stays registered, as pipeline.llm.hf has it)."""
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1]])
    ids = mask * torch.randint(3, 120, (3, 7), generator=torch.Generator().manual_seed(1))
    assert_same_samples_with_each(AttentionInterface, (sdpa_attention_forward, sdpa_attention_gqa),
                                  grouped_query_llama(), input_ids=ids, attention_mask=mask, max_new_tokens=10,
                                  pad_token_id=0)


def packed_batch(lengths, vocab=120, seed=0):
    """A padding-free batch of conversations of these lengths, as TRL's collator builds it for SFT."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    g = torch.Generator().manual_seed(seed)
    collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    return collator([{"input_ids": torch.randint(1, vocab, (n,), generator=g).tolist()} for n in lengths])


def loss_and_grads(model, batch, fn):
    AttentionInterface.register("sdpa", fn)
    try:
        model.zero_grad()
        out = model(use_cache=False, **batch)  # as TRL's SFTTrainer calls it
        out.loss.backward()
        return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
    finally:
        AttentionInterface.register("sdpa", sdpa_attention_gqa)


@pytest.mark.parametrize("model_name", ["gpt2", "grouped-query llama"])
def test_packed_rows_give_the_librarys_loss_and_gradients(model_name):
    """Padding-free training: causal SDPA per conversation against transformers' one block-diagonal mask over the
    row. Same logits and gradients up to float rounding, for the built-in GPT-2 and for grouped-query heads."""
    from transformers import GPT2Config, GPT2LMHeadModel

    if model_name == "gpt2":
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=120, n_layer=2, n_embd=32, n_head=4, n_positions=64,
                                           resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
        model.set_attn_implementation("sdpa")
    else:
        model = grouped_query_llama()
    model.train()
    batch = packed_batch([5, 17, 1, 30, 9])
    ours, our_grads = loss_and_grads(model, batch, sdpa_attention_gqa)
    theirs, their_grads = loss_and_grads(model, batch, sdpa_attention_forward)
    assert ours.shape == theirs.shape == (1, 62, 120)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    for name, grad in their_grads.items():
        torch.testing.assert_close(our_grads[name], grad, rtol=1e-4, atol=1e-6)


def test_packed_conversations_do_not_see_each_other(monkeypatch):
    """Each conversation of a packed row is one causal SDPA call of its own: changing the first conversation's tokens
    leaves the second's logits exactly as they were, and SDPA never sees keys of two conversations at once."""
    from transformers import GPT2Config, GPT2LMHeadModel

    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, **kwargs):
        calls.append((key.shape[2], kwargs.get("is_causal"), kwargs.get("attn_mask")))
        return sdpa(query, key, value, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=120, n_layer=2, n_embd=32, n_head=4, n_positions=64,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    model.set_attn_implementation("sdpa")
    AttentionInterface.register("sdpa", sdpa_attention_gqa)
    a, b = packed_batch([7, 11], seed=0), packed_batch([7, 11], seed=0)
    b["input_ids"][0, :7] = (b["input_ids"][0, :7] + 1) % 120
    logits_a = model(use_cache=False, **a).logits
    assert calls == [(7, True, None), (11, True, None)] * 2  # two layers, one call per conversation
    logits_b = model(use_cache=False, **b).logits
    assert not torch.equal(logits_a[0, :7], logits_b[0, :7])
    assert torch.equal(logits_a[0, 7:], logits_b[0, 7:])


def test_rows_without_boundaries_keep_the_librarys_function():
    """Without the collator's boundaries (a padded batch, generation) the packed path is not taken."""
    from pipeline.models.attention import packed_bounds

    q = torch.zeros(1, 4, 10, 8)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    assert packed_bounds(q, q, {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu}) == [0, 4, 10]
    assert packed_bounds(q, q, {}) is None
    two_rows = torch.zeros(2, 4, 10, 8)
    assert packed_bounds(two_rows, two_rows, {"cu_seq_lens_q": cu}) is None  # not one packed row
    assert packed_bounds(q, torch.zeros(1, 4, 12, 8), {"cu_seq_lens_q": cu}) is None  # keys from a cache
    assert packed_bounds(q, q, {"cu_seq_lens_q": torch.tensor([0, 4, 9], dtype=torch.int32)}) is None  # not covering
    assert packed_bounds(q, q, {"cu_seq_lens_q": cu, "sliding_window": 4}) is None
