"""Sampled generation draws from softmax of the warped scores (Gumbel-max over the kept tokens only)."""

import math

import pytest
import torch
from transformers import GenerationConfig, MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from pipeline.llm.base import Sampling
from pipeline.llm.hf import HFBackend
from pipeline.llm.sampler import GumbelSampler, sampler_for, sampling_warpers
from pipeline.models import tiny


def test_gumbel_sampler_draws_the_softmax_of_the_finite_scores():
    probs = [0.5, 0.3, 0.2]
    rows = 40_000
    scores = torch.tensor([[math.log(p) + 1.7 for p in probs] + [float("-inf")]] * rows)  # a shift changes nothing
    torch.manual_seed(0)
    sampler = GumbelSampler(logprobs=True)
    tokens = sampler(None, scores.clone()).argmax(-1)
    freq = torch.bincount(tokens, minlength=4).double() / rows
    assert freq[3] == 0  # a token the warpers removed is never drawn
    for i, p in enumerate(probs):  # one standard error is sqrt(p (1-p) / rows) <= 0.0025
        assert abs(freq[i].item() - p) < 0.01, (i, freq.tolist())
    # log-probs are those of the drawn tokens under softmax(scores): log 0.5, log 0.3, log 0.2
    assert torch.allclose(sampler.logprobs[:, 0], torch.log(torch.tensor(probs))[tokens].float(), atol=1e-6)


def frequencies(sampler, row, rows=40_000):
    torch.manual_seed(0)
    tokens = sampler(None, torch.tensor([row] * rows)).argmax(-1)
    return (torch.bincount(tokens, minlength=len(row)).double() / rows).tolist()


def test_top_k_inside_the_sampler_draws_the_renormalized_top_k():
    probs = [0.4, 0.3, 0.2, 0.06, 0.04]
    freq = frequencies(GumbelSampler(top_k=3), [math.log(p) for p in probs])
    assert freq[3] == freq[4] == 0
    for f, p in zip(freq, [0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9], strict=False):  # s.e. <= 0.0025
        assert abs(f - p) < 0.01, freq
    # Ties at the k-th score are all kept, as TopKLogitsWarper keeps them: scores 2, 1, 1, 0 with k = 2 draw from
    # e^2, e, e (normalized: 0.576, 0.212, 0.212), not from two of them.
    freq = frequencies(GumbelSampler(top_k=2), [2.0, 1.0, 1.0, 0.0])
    e = math.e
    for f, p in zip(freq, [e / (e + 2), 1 / (e + 2), 1 / (e + 2), 0.0], strict=True):
        assert abs(f - p) < 0.01, freq


def test_sampling_warpers_are_generates_own_in_its_order():
    warpers = sampling_warpers(GenerationConfig(top_k=7), Sampling(temperature=0.7, top_p=0.9, min_p=0.05))
    assert [type(w) for w in warpers] == [TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
                                          MinPLogitsWarper]
    assert (warpers[0].temperature, warpers[1].top_k, warpers[2].top_p, warpers[3].min_p) == (0.7, 7, 0.9, 0.05)
    # temperature 1, top-p 1 and no min-p apply nothing but the model's top-k (transformers' default is 50)
    [top_k] = sampling_warpers(GenerationConfig(), Sampling(temperature=1.0))
    assert isinstance(top_k, TopKLogitsWarper) and top_k.top_k == 50
    assert sampling_warpers(GenerationConfig(top_k=0), Sampling(temperature=1.0)) == []
    # what only transformers' sampler does is left to it
    assert sampling_warpers(GenerationConfig(typical_p=0.5), Sampling(temperature=1.0)) is None
    assert sampler_for(GenerationConfig(typical_p=0.5), Sampling(temperature=1.0)) is None
    # temperature and top-k alone are done inside the sampler; anything after top-k stays a warper before it
    [fused] = sampler_for(GenerationConfig(top_k=7), Sampling(temperature=0.7))
    assert (fused.top_k, fused.temperature) == (7, 0.7)
    *warpers, last = sampler_for(GenerationConfig(top_k=7), Sampling(temperature=0.7, top_p=0.9))
    assert [type(w) for w in warpers] == [TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper]
    assert (last.top_k, last.temperature) == (0, 1.0)


@pytest.fixture(scope="module")
def lm():
    texts = ["Is it an animal? <Answer>dog</Answer> yes no maybe the cat sat on a mat"] * 20
    tok = tiny.train_tokenizer(texts, 300)
    return tiny.build_model(tok, n_layer=2, n_embd=32, n_head=2, n_positions=256, seed=0).eval(), tok


def test_sampled_tokens_and_logprobs_follow_temperature_and_the_models_top_k(lm):
    model, tok = lm
    calls = []
    generate = model.generate
    model.generate = lambda **kw: calls.append((kw, generate(**kw))) or calls[-1][1]  # keep the token ids
    model.generation_config.top_k = 5
    try:
        backend = HFBackend("m", model_obj=model, tokenizer=tok, batch_size=8)
        convs = [[{"role": "user", "content": "guess the cat"}]] * 8  # one prompt: rows without padding
        gens = backend.generate(convs, Sampling(temperature=0.7, max_tokens=6, logprobs=True, seed=1))
    finally:
        model.generation_config.top_k = 50
        del model.generate
    [(kw, out)] = calls
    width = kw["input_ids"].shape[1]
    assert len({tuple(r) for r in out.sequences[:, width:].tolist()}) > 1  # the rows drew different tokens
    with torch.no_grad():
        logits = model(out.sequences).logits[:, width - 1 : -1] / 0.7
    top = logits.topk(5, dim=-1)
    for row, g in enumerate(gens):
        for step in range(g.tokens_out):
            t = out.sequences[row, width + step].item()
            assert t in top.indices[row, step].tolist()  # never outside the model's top 5
            kept = torch.full_like(logits[row, step], float("-inf")).scatter(0, top.indices[row, step],
                                                                              top.values[row, step])
            assert g.token_logprobs[step] == pytest.approx(kept.log_softmax(-1)[t].item(), abs=1e-4)


def test_a_config_only_transformers_samples_falls_back_to_it(lm):
    model, tok = lm
    model.generation_config.typical_p = 0.9
    try:
        backend = HFBackend("m", model_obj=model, tokenizer=tok, batch_size=4)
        sampling = Sampling(temperature=1.0, max_tokens=4, logprobs=True, seed=2)
        a = backend.generate([[{"role": "user", "content": "guess"}]] * 3, sampling)
        b = backend.generate([[{"role": "user", "content": "guess"}]] * 3, sampling)
    finally:
        model.generation_config.typical_p = 1.0
    assert [g.text for g in a] == [g.text for g in b]  # seeded
    assert all(len(g.token_logprobs) == g.tokens_out for g in a)
