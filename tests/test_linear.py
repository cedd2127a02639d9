"""Linear layers through oneDNN with reordered weights (``policy.cpu_linear: onednn``): the same model outputs up
to float rounding, only while active, and following weights trained in place."""

import torch
from conftest import grouped_query_llama

from pipeline.llm.base import Sampling
from pipeline.llm.hf import HFBackend
from pipeline.models.linear import OneDNNLinears


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_active_runs_every_linear_layer_through_onednn_and_leaves_the_model_as_it_was(monkeypatch):
    import pipeline.models.linear as linear

    calls = []
    onednn = linear._linear

    def counted(x, weight, bias):
        calls.append(x.shape[-1])
        return onednn(x, weight, bias)

    monkeypatch.setattr(linear, "_linear", counted)
    model = grouped_query_llama()
    ids = torch.randint(3, 120, (3, 9), generator=torch.Generator().manual_seed(1))
    before = logits(model, ids)
    linears = OneDNNLinears(model)
    assert len(linears.layers) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer; the output layer
    with linears.active():
        inside = logits(model, ids)
        assert len(calls) == 15  # one forward: every linear layer once, through oneDNN
        probe = torch.randn(2, 5, 48)
        layer = model.model.layers[0].self_attn.q_proj
        assert torch.allclose(layer(probe), probe @ layer.weight.T, atol=1e-5)
    assert torch.allclose(inside, before, atol=1e-4)
    assert torch.equal(inside.argmax(-1), before.argmax(-1))
    calls.clear()
    assert torch.equal(logits(model, ids), before) and not calls  # torch's own layers again, bit for bit


def test_weights_changed_in_place_are_reordered_again():
    model = grouped_query_llama()
    ids = torch.randint(3, 120, (2, 6), generator=torch.Generator().manual_seed(2))
    linears = OneDNNLinears(model)
    with linears.active():
        first = logits(model, ids)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(3.0)  # as an optimizer step does, in place
    trained = logits(model, ids)
    with linears.active():
        again = logits(model, ids)
    assert not torch.allclose(first, trained, atol=1e-3)
    assert torch.allclose(again, trained, atol=1e-4)


def test_the_hf_backend_plays_the_same_greedy_replies_through_onednn():
    from pipeline.models import tiny

    tok = tiny.train_tokenizer(["Is it an animal? <Answer>dog</Answer> yes no maybe the cat sat on a mat"] * 20, 300)
    model = tiny.build_model(tok, n_layer=2, n_embd=32, n_head=2, n_positions=256, seed=0).eval()
    conversations = [[{"role": "user", "content": "guess " * (i + 1)}] for i in range(5)]
    greedy = Sampling(temperature=0.0, max_tokens=8, logprobs=True)
    plays = [HFBackend("m", model_obj=model, tokenizer=tok, batch_size=3, cpu_linear=linear).generate(
        conversations, greedy) for linear in ("torch", "onednn")]
    for a, b in zip(*plays, strict=True):
        assert a.text == b.text and a.tokens_out == b.tokens_out
        assert max(abs(p - q) for p, q in zip(a.token_logprobs, b.token_logprobs, strict=True)) < 1e-4
