"""The hf backend keeps each conversation's KV cache across turns: same generations, far fewer tokens processed."""

import pytest
import torch

from pipeline.llm.base import Sampling
from pipeline.llm.hf import HFBackend
from pipeline.models import tiny

GREEDY = Sampling(temperature=0.0, max_tokens=8, logprobs=True)


@pytest.fixture(scope="module")
def lm():
    texts = ["Is it an animal? <Answer>dog</Answer> yes no maybe the cat sat on a mat"] * 20
    tok = tiny.train_tokenizer(texts, 300)
    return tiny.build_model(tok, n_layer=2, n_embd=32, n_head=2, n_positions=256, seed=0).eval(), tok


def backends(lm, batch_size=3, **kw):
    model, tok = lm
    return (HFBackend("m", model_obj=model, tokenizer=tok, batch_size=batch_size, **kw),
            HFBackend("m", model_obj=model, tokenizer=tok, batch_size=batch_size, kv_cache_bytes=0))


def opening(n):
    """n conversations of different lengths, so batches mix reused prefixes and paddings of many widths."""
    return [[{"role": "system", "content": "play"}, {"role": "user", "content": "guess " * (i + 1)}] for i in range(n)]


def assert_same(cached, full):
    for x, y in zip(cached, full, strict=True):
        assert x.text == y.text and x.tokens_out == y.tokens_out and x.tokens_in == y.tokens_in
        assert max(abs(p - q) for p, q in zip(x.token_logprobs, y.token_logprobs, strict=True)) < 1e-4


def test_multi_turn_generations_equal_a_full_reencode(lm):
    kv, full = backends(lm)
    convs = opening(5)
    last_prompt = [0] * 5
    for turn in range(6):
        a, b = kv.generate(convs, GREEDY), full.generate(convs, GREEDY)
        assert_same(a, b)
        reused = [g.meta["cached_tokens"] for g in a]
        # everything up to the last turn's generated reply came from the cache (nothing on the first turn)
        assert all(n >= prev for n, prev in zip(reused, last_prompt, strict=True)), (reused, last_prompt)
        last_prompt = [g.tokens_in for g in a]
        convs = [[*c, {"role": "assistant", "content": g.text}, {"role": "user", "content": "no " * turn}]
                 for c, g in zip(convs, a, strict=True)]
    assert kv.prompt_tokens + kv.cached_tokens == full.prompt_tokens
    assert kv.prompt_tokens < full.prompt_tokens / 3
    assert len(kv.kv) == 5 * 2  # one entry per conversation, under its two lookup keys


def test_resampled_turn_reuses_its_prompt_and_truncation_falls_back(lm):
    kv, full = backends(lm)
    convs = opening(2)
    first = kv.generate(convs, GREEDY)
    convs = [[*c, {"role": "assistant", "content": g.text}, {"role": "user", "content": "no"}]
             for c, g in zip(convs, first, strict=True)]
    kv.generate(convs, GREEDY)
    again = kv.generate(convs, GREEDY)  # a format retry: the same conversation once more
    assert all(g.meta["cached_tokens"] >= g.tokens_in - 1 for g in again)
    assert_same(again, full.generate(convs, GREEDY))
    # A conversation past the context drops its oldest turns: the kept tokens no longer match its prompt's head,
    # and the result is as without a cache.
    long = [[*c, *[{"role": "assistant", "content": "is it"}, {"role": "user", "content": "maybe " * 20}] * 12]
            for c in convs]
    assert_same(kv.generate(long, GREEDY), full.generate(long, GREEDY))


def test_memory_budget_bounds_what_is_kept(lm):
    kv, full = backends(lm, kv_cache_bytes=20_000)
    convs = opening(6)
    for _ in range(3):
        a = kv.generate(convs, GREEDY)
        assert_same(a, full.generate(convs, GREEDY))
        assert 0 < kv.kv.nbytes <= 20_000
        convs = [[*c, {"role": "assistant", "content": g.text}, {"role": "user", "content": "no"}]
                 for c, g in zip(convs, a, strict=True)]


def test_training_in_place_drops_the_kept_caches(lm):
    model, tok = lm
    copy = tiny.build_model(tok, n_layer=2, n_embd=32, n_head=2, n_positions=256, seed=0).eval()
    copy.load_state_dict(model.state_dict())
    kv = HFBackend("m", model_obj=copy, tokenizer=tok, batch_size=3)
    convs = opening(2)
    first = kv.generate(convs, GREEDY)
    convs = [[*c, {"role": "assistant", "content": g.text}, {"role": "user", "content": "no"}]
             for c, g in zip(convs, first, strict=True)]
    with torch.no_grad():
        next(copy.parameters()).mul_(1.5)  # an optimizer step, as ArCHer takes between rounds
    after = kv.generate(convs, GREEDY)
    assert [g.meta["cached_tokens"] for g in after] == [0, 0]
    full = HFBackend("m", model_obj=copy, tokenizer=tok, batch_size=3, kv_cache_bytes=0)
    assert_same(after, full.generate(convs, GREEDY))


def test_roomy_cache_holds_what_a_dynamic_cache_holds_and_writes_in_place():
    from transformers import DynamicCache

    from pipeline.llm.kv_cache import RoomyCache

    g = torch.Generator().manual_seed(0)
    steps = [torch.randn(3, 2, n, 4, generator=g) for n in (5, 1, 1, 1, 4, 1)]  # prefill, decodes, then past the room
    roomy, dynamic = RoomyCache(n_layers=1, room=3), DynamicCache()
    pointers = []
    for k in steps:
        a, b = roomy.update(k, -k, 0), dynamic.update(k, -k, 0)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert roomy.get_seq_length() == dynamic.get_seq_length()
        pointers.append(roomy.layers[0].keys.data_ptr())
    assert len(set(pointers[:4])) == 1  # prefill + 3 decode steps fit the room: written in place, never copied
    assert pointers[4] != pointers[3]  # 4 more did not: the buffer grew
    for op, arg in (("batch_select_indices", torch.tensor([2, 0])), ("crop", -6)):  # 13 tokens, 6 removed
        getattr(roomy, op)(arg)
        getattr(dynamic, op)(arg)
        assert torch.equal(roomy.layers[0].keys, dynamic.layers[0].keys)
        k = torch.randn(2, 2, 1, 4, generator=g)
        assert torch.equal(roomy.update(k, k, 0)[0], dynamic.update(k, k, 0)[0])


def test_batches_with_and_without_the_roomy_cache_sample_the_same_tokens(lm, monkeypatch):
    import pipeline.llm.hf as hf

    sampled = Sampling(temperature=1.0, max_tokens=8, logprobs=True, seed=3)
    runs = []
    for min_rows in (2, 10**6):  # a RoomyCache for the batch of 5, or transformers' DynamicCache
        monkeypatch.setattr(hf, "ROOMY_MIN_ROWS", min_rows)
        kv, _ = backends(lm, batch_size=5)
        convs, gens = opening(5), []
        for turn in range(4):
            out = kv.generate(convs, sampled)
            gens.append([(g.text, g.token_logprobs) for g in out])
            convs = [[*c, {"role": "assistant", "content": g.text}, {"role": "user", "content": "no " * turn}]
                     for c, g in zip(convs, out, strict=True)]
        runs.append(gens)
    assert runs[0] == runs[1]  # bitwise: the same keys / values reach attention


def test_kept_caches_stay_in_the_batch_cache_until_a_call_does_not_reuse_them(lm):
    kv, full = backends(lm)
    convs = opening(3)
    first = kv.generate(convs, GREEDY)
    full.generate(convs, GREEDY)
    store = kv.kv
    entries = [store._keys[k] for k in list(store._keys)]
    assert entries and all(e.kv is None and e.source is not None for e in entries)  # not copied out yet
    nxt = [[*c, {"role": "assistant", "content": g.text}, {"role": "user", "content": "no"}]
           for c, g in zip(convs, first, strict=True)]
    held = {i: [t.clone() for t in store.lookup(c, kv.encode([c], 8)[0])[1].pieces(0, 0, 10**6)]
            for i, c in enumerate(nxt)}
    # Only conversation 0 plays on: 1 and 2's entries are copied out of the first call's batch cache, the same
    # numbers, and the first call's cache is referenced by no entry any more.
    a0 = kv.generate(nxt[:1], GREEDY)
    assert_same(a0, full.generate(nxt[:1], GREEDY))
    for i in (1, 2):
        n, e = store.lookup(nxt[i], kv.encode([nxt[i]], 8)[0])
        assert n > 0 and e.source is None and e.kv is not None
        assert torch.equal(e.kv[0][0], torch.cat(held[i], dim=1))
    assert len(store._in_batch) == 1  # conversation 0's new entry, held in the second call's cache
    # ... and a later turn reuses them as it would have reused them in place
    later = kv.generate(nxt[1:], GREEDY)
    assert all(g.meta["cached_tokens"] > 0 for g in later)
    assert_same(later, full.generate(nxt[1:], GREEDY))


def test_a_batch_that_drops_its_finished_rows_generates_what_the_whole_batch_does(lm):
    """``drop_finished``: once rows have finished, the batch decodes on without them; greedy replies, their
    logprobs and the kept caches the next turns reuse are those of the batch decoded whole."""
    _, tok = lm
    model = tiny.build_model(tok, n_layer=2, n_embd=32, n_head=2, n_positions=256, seed=0).eval()
    torch.manual_seed(0)
    with torch.no_grad():  # weights loud enough that greedy replies vary from row to row and turn to turn
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    whole = HFBackend("m", model_obj=model, tokenizer=tok, batch_size=6)
    dropping = HFBackend("m", model_obj=model, tokenizer=tok, batch_size=6, drop_finished=0.1)
    for b in (whole, dropping):
        b.stop_ids = list(range(0, len(tok), 7))  # replies end after a few tokens, at different steps
    sizes = []
    real_generate = model.generate

    def counting(*args, **kwargs):
        sizes.append(kwargs["input_ids"].shape[0])
        return real_generate(*args, **kwargs)

    convs, dropped = opening(6), 0
    for turn in range(4):
        a = whole.generate(convs, GREEDY)
        sizes.clear()
        model.generate = counting
        try:
            b = dropping.generate(convs, GREEDY)
        finally:
            del model.generate
        assert_same(b, a)
        # a row that ends a call has its stop token's keys / values never computed: one token less to reuse
        assert all(y.meta["cached_tokens"] - 1 <= x.meta["cached_tokens"] <= y.meta["cached_tokens"]
                   for x, y in zip(b, a, strict=True))
        if len({g.tokens_out for g in a}) > 1:  # rows finished at different steps: later calls decoded fewer rows
            dropped += 1
            assert sizes[0] == 6 and len(sizes) > 1 and sizes == sorted(sizes, reverse=True) and sizes[-1] < 6
        convs = [[*c, {"role": "assistant", "content": g.text}, {"role": "user", "content": "no " * turn}]
                 for c, g in zip(convs, a, strict=True)]
    assert dropped > 0
    assert dropping.generated_tokens == whole.generated_tokens
    assert dropping.prompt_tokens + dropping.cached_tokens == whole.prompt_tokens + whole.cached_tokens
    assert whole.cached_tokens >= dropping.cached_tokens > whole.cached_tokens * 0.8


def test_a_sampled_batch_that_drops_its_finished_rows_keeps_each_rows_logprobs(lm):
    model, tok = lm
    b = HFBackend("m", model_obj=model, tokenizer=tok, batch_size=8, drop_finished=0.2)
    b.stop_ids = list(range(0, 300, 7))  # about one token in seven ends a reply
    out = b.generate(opening(8), Sampling(temperature=1.0, max_tokens=12, logprobs=True, seed=1))
    assert len({g.tokens_out for g in out}) > 1
    for g in out:
        assert len(g.token_logprobs) == g.tokens_out and all(p <= 0 for p in g.token_logprobs)


def test_bfloat16_plays_a_copy_with_a_float32_head_and_keeps_its_caches_in_bfloat16(lm):
    """``dtype="bfloat16"``: the backend plays a bfloat16 copy (the given model, e.g. one being trained, keeps its
    float32 weights), with float32 logits from a float32 output layer and eager attention on the CPU; multi-turn
    play with kept caches and dropped rows works, the caches taking half the bytes per token."""
    model, tok = lm
    b16 = HFBackend("m", model_obj=model, tokenizer=tok, batch_size=4, drop_finished=0.3, dtype="bfloat16")
    b32 = HFBackend("m", model_obj=model, tokenizer=tok, batch_size=4, drop_finished=0.3, dtype="float32")
    assert b32.lm is model and model.dtype == torch.float32 and b16.lm is not model
    assert model.config._attn_implementation == "sdpa" and b16.lm.config._attn_implementation == "eager"
    head = b16.lm.get_output_embeddings().weight
    assert head.dtype == torch.float32 and {p.dtype for p in b16.lm.parameters() if p is not head} == {torch.bfloat16}
    ids = torch.tensor([b16.encode(opening(1))[0]])
    with torch.no_grad():
        got, want = b16.lm(input_ids=ids).logits, model(input_ids=ids).logits
    assert got.dtype == torch.float32
    assert (got - want).abs().max() < 0.05 * want.abs().max()  # rounding, not another model
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    sampling = Sampling(temperature=1.0, max_tokens=8, logprobs=True, seed=3)
    per_token = {}
    for b in (b16, b32):
        convs = opening(4)
        for turn in range(3):
            out = b.generate(convs, sampling)
            assert all(len(g.token_logprobs) == g.tokens_out and all(p <= 0 for p in g.token_logprobs) for g in out)
            convs = [[*c, {"role": "assistant", "content": g.text}, {"role": "user", "content": "no " * turn}]
                     for c, g in zip(convs, out, strict=True)]
        assert b.cached_tokens > 0  # later turns reused the kept keys / values
        entry = next(iter(b.kv._keys.values()))
        entry.materialize()
        per_token[b] = entry.nbytes / len(entry.tokens)
    assert per_token[b16] * 2 == per_token[b32]


def test_bfloat16_plays_a_model_it_loads_itself_as_it_plays_a_copy_of_a_given_one(lm, tmp_path):
    """A backend that loads its model converts it in place (no float32 copy kept), to the same weights
    and float32 output layer as the copy made of a given model."""
    model, tok = lm
    tiny.save(model, tok, tmp_path / "m")
    loaded = HFBackend(tmp_path / "m", dtype="bfloat16")
    given = HFBackend("m", model_obj=model, tokenizer=tok, dtype="bfloat16")
    assert loaded.lm.config._attn_implementation == "eager"
    mine, theirs = dict(loaded.lm.named_parameters()), dict(given.lm.named_parameters())
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert mine["lm_head.weight"].dtype == torch.float32 and mine["transformer.wte.weight"].dtype == torch.bfloat16


def test_a_budget_smaller_than_the_episodes_in_play_still_reuses_what_it_holds():
    """Play steps every episode each turn, in batches. With room for 2 of 4 conversations, least-recently-used
    eviction would drop each one before its next turn (batch 1 stores and evicts batch 2's entries, batch 2 then
    evicts batch 1's: no reuse, ever). The cache instead keeps the entries it holds and refuses new ones while
    every kept entry is in use, so each turn reuses 2 of 4; a finished episode's entry makes room."""
    from pipeline.llm.kv_cache import ConversationKV, Entry

    kv = ConversationKV(max_bytes=250)  # 2 entries of 100 bytes
    convs = [[{"role": "system", "content": "play"}, {"role": "user", "content": f"game {i}"}] for i in range(4)]

    def turn(convs):
        kv.settle(convs)
        hits = []
        for batch in (convs[:2], convs[2:]):  # batch_size 2, as HFBackend.generate runs them
            found = [kv.lookup(c, [1, 2, 3, 4]) for c in batch]
            hits += [n for n, _ in found]
            for c, (_, old) in zip(batch, found, strict=True):
                kv.store(c, "reply", Entry([1, 2, 3], [], 100), replaces=old)
        return hits, [[*c, {"role": "assistant", "content": "reply"}, {"role": "user", "content": "no"}]
                      for c in convs]

    hits, convs = turn(convs)
    assert hits == [0, 0, 0, 0] and kv.refused == 2 and kv.nbytes == 200
    for _ in range(3):
        hits, convs = turn(convs)
        assert hits == [3, 3, 0, 0]  # the first two conversations' 3 kept tokens, every turn
    assert kv.nbytes == 200
    # Episodes 0 and 1 finish: their entries are no longer in use, and the others' new entries take their place.
    hits, _ = turn(convs[2:])
    assert hits == [0, 0] and kv.nbytes == 200 and len(kv) == 4  # two entries, each under its two lookup keys
    hits, _ = turn([[*c, {"role": "assistant", "content": "reply"}, {"role": "user", "content": "no"}]
                    for c in convs[2:]])
    assert hits == [3, 3]
