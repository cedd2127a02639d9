"""Response cache and the CachedBackend wrapper: dedup, persistence, concurrency, what is (not) cached."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.llm.base import ChatBackend, Generation, Sampling
from pipeline.llm.cache import CachedBackend, ResponseCache, default_cache_path, model_identity, request_key
from pipeline.llm.ledger import Ledger

REPO = Path(__file__).resolve().parents[1]


class CountingBackend(ChatBackend):
    """Answers "re: <last message>"; remembers every conversation it was sent."""

    name = "counting"

    def __init__(self, delay_s: float = 0.0, fail_on: str | None = None) -> None:
        super().__init__("count-model")
        self.sent: list[str] = []
        self.delay_s = delay_s
        self.fail_on = fail_on
        self.started = threading.Event()
        self._lock = threading.Lock()

    def generate(self, conversations, sampling):
        with self._lock:
            self.sent += [c[-1]["content"] for c in conversations]
        self.started.set()
        time.sleep(self.delay_s)
        return [
            Generation(text="", error="boom")
            if c[-1]["content"] == self.fail_on
            else Generation(text="re: " + c[-1]["content"], tokens_in=3, tokens_out=2)
            for c in conversations
        ]


def conv(text):
    return [{"role": "user", "content": text}]


GREEDY = Sampling(max_tokens=8)


def test_default_location(monkeypatch, tmp_path):
    monkeypatch.delenv("CURIO_CACHE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_cache_path() == tmp_path / ".cache" / "curio" / "llm-cache.sqlite"
    monkeypatch.setenv("CURIO_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert default_cache_path() == tmp_path / "elsewhere" / "llm-cache.sqlite"


def test_key_covers_backend_model_messages_and_sampling():
    base = request_key("openai", "m", conv("a"), GREEDY)
    assert base == request_key("openai", "m", conv("a"), Sampling(max_tokens=8))
    others = {
        request_key("vllm", "m", conv("a"), GREEDY),
        request_key("openai", "m2", conv("a"), GREEDY),
        request_key("openai", "m", conv("b"), GREEDY),
        request_key("openai", "m", conv("a"), Sampling(max_tokens=9)),
        request_key("openai", "m", conv("a"), Sampling(max_tokens=8, seed=1)),
    }
    assert base not in others and len(others) == 5


def test_batch_dedup_and_rerun_from_cache(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    inner = CountingBackend()
    backend = CachedBackend(inner, cache, Ledger("judge"))
    batch = [conv("a"), conv("b"), conv("a"), conv("c"), conv("b")]
    out = backend.generate(batch, GREEDY)
    assert [g.text for g in out] == ["re: a", "re: b", "re: a", "re: c", "re: b"]
    assert sorted(inner.sent) == ["a", "b", "c"]
    assert [g.cached for g in out] == [False, False, True, False, True]

    # A new process-like start: fresh wrapper, same file -> nothing is sent.
    inner2 = CountingBackend()
    again = CachedBackend(inner2, ResponseCache(tmp_path / "c.sqlite"), Ledger("judge"))
    out2 = again.generate(batch, GREEDY)
    assert inner2.sent == [] and [g.text for g in out2] == [g.text for g in out] and all(g.cached for g in out2)
    m = again.ledger.metrics()
    assert m["llm_judge_requests"] == 5 and m["llm_judge_unique_requests"] == 3 and m["llm_judge_cache_hits"] == 3
    assert m["llm_judge_sent"] == 0


def test_failures_are_not_cached(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    backend = CachedBackend(CountingBackend(fail_on="b"), cache)
    out = backend.generate([conv("a"), conv("b")], GREEDY)
    assert out[1].error == "boom" and len(cache) == 1
    assert backend.ledger.failures == 1
    inner = CountingBackend()
    CachedBackend(inner, cache).generate([conv("a"), conv("b")], GREEDY)
    assert inner.sent == ["b"]


def test_sampling_without_seed_bypasses_cache_and_dedup(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    inner = CountingBackend()
    backend = CachedBackend(inner, cache)
    sampled = Sampling(temperature=0.7, max_tokens=8)
    backend.generate([conv("a")] * 4, sampled)
    assert inner.sent == ["a"] * 4 and len(cache) == 0  # four independent draws
    seeded = Sampling(temperature=0.7, max_tokens=8, seed=3)
    backend.generate([conv("a")] * 4, seeded)
    backend.generate([conv("a")], seeded)
    assert inner.sent == ["a"] * 5 and len(cache) == 1


def test_identical_requests_in_flight_are_sent_once(tmp_path):
    inner = CountingBackend(delay_s=0.3)
    backend = CachedBackend(inner, ResponseCache(tmp_path / "c.sqlite"))
    results = {}

    def call(name, texts):
        results[name] = [g.text for g in backend.generate([conv(t) for t in texts], GREEDY)]

    first = threading.Thread(target=call, args=("first", ["a", "b"]))
    first.start()
    assert inner.started.wait(5)
    second = threading.Thread(target=call, args=("second", ["b", "c"]))
    second.start()
    first.join()
    second.join()
    assert sorted(inner.sent) == ["a", "b", "c"]
    assert results == {"first": ["re: a", "re: b"], "second": ["re: b", "re: c"]}
    assert backend.ledger.shared == 1


def test_concurrent_writer_processes(tmp_path):
    """Four processes write overlapping keys into one file at once: no error, every key stored once."""
    path = tmp_path / "shared.sqlite"
    script = (
        "import sys; from pipeline.llm.cache import ResponseCache; from pipeline.llm.base import Generation\n"
        "c = ResponseCache(sys.argv[1]); w = int(sys.argv[2])\n"
        "for r in range(20):\n"
        "    lo = w * 50 + r * 10\n"
        "    c.put_many({f'k{i}': Generation(text=f'v{i}') for i in range(lo, lo + 100)})\n"
        "    c.get_many([f'k{i}' for i in range(300)])\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(path), str(w)], cwd=REPO, stderr=subprocess.PIPE, text=True
        )
        for w in range(4)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    cache = ResponseCache(path)
    expected = {
        f"k{i}" for w in range(4) for r in range(20) for i in range(w * 50 + r * 10, w * 50 + r * 10 + 100)
    }
    assert len(cache) == len(expected)
    got = cache.get_many(sorted(expected))
    assert all(got[k].text == "v" + k[1:] for k in expected)


def test_model_identity_changes_when_weights_are_rewritten(tmp_path):
    model = tmp_path / "policy"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"old")
    before = model_identity(str(model))
    time.sleep(0.01)
    (model / "model.safetensors").write_bytes(b"newer weights")
    assert model_identity(str(model)) != before
    assert model_identity("some/hub-model") == "some/hub-model"


@pytest.mark.parametrize("prefix", [None, "judge", "judge."])
def test_ledger_metrics_are_flat(prefix):
    ledger = Ledger("judge")
    ledger.record_batch(requests=4, unique=3, cache_hits=1)
    for latency in (0.1, 0.2, 0.3):
        ledger.record_sent(Generation(text="x", tokens_in=5, tokens_out=2, meta={"retries": 1}), latency)
    ledger.record_sent(Generation(text="", error="down"), 1.0)
    ledger.count_unknown(2)
    m = ledger.metrics(prefix)
    p = {None: "llm_judge_", "judge": "judge_", "judge.": "judge."}[prefix]
    assert m[p + "requests"] == 4 and m[p + "unique_requests"] == 3 and m[p + "cache_hits"] == 1
    assert m[p + "sent"] == 4 and m[p + "tokens_in"] == 15 and m[p + "tokens_out"] == 6
    assert m[p + "retries"] == 3 and m[p + "failures"] == 1 and m[p + "unknowns"] == 2
    assert m[p + "latency_p50_s"] == pytest.approx(0.25) and 0.3 < m[p + "latency_p95_s"] <= 1.0
    assert all(isinstance(v, int | float) for v in m.values())
