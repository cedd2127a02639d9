"""The openai backend against a real OpenAI-compatible HTTP server on 127.0.0.1 (tests/fake_openai_server.py)."""

import logging
import socket
import sqlite3
import threading
import time

import pytest
from fake_openai_server import CURIO_RULES, FakeServer

from pipeline.core.tracking import flatten_params
from pipeline.llm import CachedBackend, make_backend, sampling_from_config
from pipeline.llm.base import Sampling
from pipeline.llm.check import CheckFailed, check_role
from pipeline.llm.config import LLMConfig
from pipeline.llm.ledger import Usage
from pipeline.llm.openai_backend import OpenAIBackend
from pipeline.nethack.annotation import annotate_preferences, label_messages
from pipeline.params import Params, load_params

KEY_ENV = "CURIO_TEST_LLM_KEY"
SENTINEL = "sk-curio-SENTINEL-7f3a9c"


@pytest.fixture(scope="module")
def server():
    srv = FakeServer()
    yield srv
    srv.close()


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SENTINEL)
    return SENTINEL


@pytest.fixture
def cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("CURIO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def cfg_for(server, **kw) -> LLMConfig:
    values = dict(
        backend="openai",
        model="fake-model",
        base_url=server.base_url,
        api_key_env=KEY_ENV,
        max_concurrency=16,
        timeout_s=2.0,
        max_retries=3,
        backoff_s=0.01,
        max_tokens=64,
    )
    values.update(kw)
    return LLMConfig(**values)


def convs(n, tag="q"):
    return [[{"role": "user", "content": f"{tag} {i}"}] for i in range(n)]


def test_answers_in_order_with_usage_and_capped_max_tokens(server, key, cache_dir):
    server.configure()
    backend = make_backend(cfg_for(server, max_tokens=50), role="judge")
    out = backend.generate(convs(20), Sampling(max_tokens=4096))
    backend.close()
    stats = server.stats()
    assert len(out) == 20 and all(g.error is None and g.text.startswith("echo ") for g in out)
    assert len({g.text for g in out}) == 20 and all(g.tokens_in == 3 and g.tokens_out == 2 for g in out)
    assert stats["requests"] == 20 and stats["max_tokens_seen"] == 50  # asked 4096, capped by params
    assert stats["last_authorization"] == f"Bearer {SENTINEL}"  # the key came from the environment


def test_concurrency_is_bounded_by_the_semaphore(server, key):
    server.configure(latency_s=0.05)
    backend = OpenAIBackend("fake-model", server.base_url, api_key_env=KEY_ENV, max_concurrency=4)
    threads = [threading.Thread(target=backend.generate, args=(convs(20, f"t{t}"), Sampling())) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    backend.close()
    assert server.stats()["requests"] == 40 and server.stats()["max_in_flight"] == 4


def test_client_processes_share_the_requests_and_the_concurrency(server, key, cache_dir):
    server.configure(latency_s=0.05)
    single = OpenAIBackend("fake-model", server.base_url, api_key_env=KEY_ENV, max_concurrency=6)
    expected = [g.text for g in single.generate(convs(30, "p"), Sampling())]
    single.close()
    server.configure(latency_s=0.05)  # zero the counters
    backend = make_backend(cfg_for(server, max_concurrency=6, client_processes=2, cache=False), role="annotator")
    results = {}
    threads = [threading.Thread(target=lambda t=t: results.setdefault(t, backend.generate(convs(30, t), Sampling())))
               for t in ("p", "q")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    procs = list(backend.inner._procs)
    backend.close()
    stats = server.stats()
    assert [g.text for g in results["p"]] == expected and all(g.error is None for g in results["q"])
    assert len({p.pid for p in procs}) == 2 and not any(p.is_alive() for p in procs)
    # both processes had requests in flight at once, never more than max_concurrency in all
    assert stats["requests"] == 60 and 3 < stats["max_in_flight"] <= 6
    with pytest.raises(ValueError, match="client_processes"):
        cfg_for(server, max_concurrency=2, client_processes=4)


def test_retries_are_bounded_and_failures_do_not_raise(server, key):
    server.configure(error_rate=1.0)
    backend = OpenAIBackend("fake-model", server.base_url, api_key_env=KEY_ENV, max_retries=2, backoff_s=0.01)
    out = backend.generate(convs(5), Sampling())
    backend.close()
    assert server.stats()["requests"] == 15  # 1 attempt + 2 retries each, no more
    assert all(g.text == "" and g.error.startswith("HTTP ") and g.meta["retries"] == 2 for g in out)


def test_timeouts_are_retried_then_reported(server, key):
    server.configure(timeout_rate=1.0, hang_s=3.0)
    backend = OpenAIBackend(
        "fake-model", server.base_url, api_key_env=KEY_ENV, max_retries=1, timeout_s=0.2, backoff_s=0.01
    )
    start = time.monotonic()
    [g] = backend.generate(convs(1), Sampling())
    backend.close()
    assert g.error == "timeout after 0.2 s" and time.monotonic() - start < 2.0


def test_refused_connections_are_retried_then_reported(key):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = OpenAIBackend("m", f"http://127.0.0.1:{port}/v1", api_key_env=KEY_ENV, max_retries=2, backoff_s=0.01)
    [g] = backend.generate(convs(1), Sampling())
    backend.close()
    assert g.error.startswith("connection error") and "refused" in g.error.lower() and g.meta["retries"] == 2


def test_malformed_bodies_are_retried(server, key):
    server.configure(malformed_rate=1.0)
    backend = OpenAIBackend("fake-model", server.base_url, api_key_env=KEY_ENV, max_retries=1, backoff_s=0.01)
    out = backend.generate(convs(6), Sampling())
    backend.close()
    assert server.stats()["requests"] == 12 and all("malformed" in g.error or "JSON" in g.error for g in out)


def test_client_errors_are_not_retried_and_the_key_is_scrubbed(server, key, caplog):
    server.configure(reject_auth=True)
    backend = OpenAIBackend("fake-model", server.base_url, api_key_env=KEY_ENV, max_retries=5)
    with caplog.at_level(logging.DEBUG):
        [g] = backend.generate(convs(1), Sampling())
    backend.close()
    assert server.stats()["requests"] == 1 and g.error.startswith("HTTP 401")
    assert SENTINEL not in g.error and "***" in g.error  # the server echoed the key; we did not keep it
    assert SENTINEL not in caplog.text


def test_missing_key_variable_is_one_clear_line(server, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ValueError, match=f"environment variable {KEY_ENV} .* is not set"):
        make_backend(cfg_for(server), role="judge")


def test_warm_rerun_sends_zero_requests(server, key, cache_dir):
    server.configure(latency_s=0.01, rules=CURIO_RULES)
    pairs = [(f"You kill the newt! (x{i})", f"You see here {i} gold pieces.") for i in range(40)]
    pairs += [("same", "same"), pairs[0]]  # a TIE without a call and a duplicate of the first pair
    cfg = cfg_for(server, temperature=0.1, top_p=0.95)

    cold = make_backend(cfg, role="annotator")
    first = annotate_preferences(cold, pairs, "defaultgoal", "default", sampling_from_config(cfg))
    cold.close()
    sent = server.stats()["requests"]
    assert first[-2] == ("TIE", "", Usage()) and first[-1][:2] == first[0][:2]
    assert sent == cold.ledger.sent and sent >= 40
    # each row's usage: the duplicate and the TIE sent nothing; summed over the rows, the ledger's counts
    assert first[-1].usage == Usage(cached=True) and first[0].usage.attempts >= 1 and not first[0].usage.cached
    assert sum(a.usage.attempts for a in first) == cold.ledger.sent + cold.ledger.retries
    assert sum(a.usage.tokens_in for a in first) == cold.ledger.tokens_in > 0
    assert sum(a.usage.tokens_out for a in first) == cold.ledger.tokens_out > 0

    # Parsed answers are served from the cache; only the UNKNOWN ones (this server's answers to them never
    # parse) are asked again, until annotator.max_attempts sends of each request; then nothing is sent.
    unknown = sum(a.label == "UNKNOWN" for a in first[:-1])
    assert unknown > 0
    for attempt in range(2, cfg.max_attempts + 2):
        server.configure(latency_s=0.01, rules=CURIO_RULES)  # zero the counters
        warm = make_backend(cfg, role="annotator")
        second = annotate_preferences(warm, pairs, "defaultgoal", "default", sampling_from_config(cfg))
        warm.close()
        assert [a.label for a in second] == [a.label for a in first]
        assert [x[:2] for x in second if x.label != "UNKNOWN"] == [x[:2] for x in first if x.label != "UNKNOWN"]
        assert all(x.usage == Usage(cached=True) for x in second[:-2] if x.label != "UNKNOWN")  # from the cache
        assert server.stats()["requests"] == warm.ledger.sent
        if attempt <= cfg.max_attempts:
            assert 0 < warm.ledger.sent <= 2 * unknown  # the request and, maybe, its retry turn
        else:
            assert warm.ledger.sent == 0 and warm.ledger.cache_hits == warm.ledger.unique_requests


def test_fault_injected_run_labels_every_item(server, key, cache_dir):
    """20% 5xx, 10% timeouts, 10% garbage: every item ends FIRST/SECOND/TIE or UNKNOWN, nothing raises."""
    server.configure(error_rate=0.2, timeout_rate=0.1, garbage_rate=0.1, hang_s=2.0, rules=CURIO_RULES, seed=7)
    cfg = cfg_for(server, max_concurrency=64, timeout_s=0.3, max_retries=3, temperature=0.1, top_p=0.95)
    pairs = [(f"You hit the jackal. (x{i})", f"You descend the stairs {i}.") for i in range(150)]
    backend = make_backend(cfg, role="annotator")
    labels = annotate_preferences(backend, pairs, "stairs", "reworded", sampling_from_config(cfg))
    backend.close()
    ledger = backend.ledger
    assert len(labels) == len(pairs) and {a.label for a in labels} <= {"FIRST", "SECOND", "TIE", "UNKNOWN"}
    unknown = [(a.label, a.raw) for a in labels if a.label == "UNKNOWN"]
    assert unknown and ledger.unknowns == len(unknown)
    assert all(raw for _, raw in unknown)  # the raw answers (or the failure) are kept
    assert ledger.retries > 0 and ledger.retries <= 3 * ledger.sent
    stats = server.stats()
    assert stats["by_outcome"]["error"] > 0 and stats["by_outcome"]["timeout"] > 0
    assert stats["by_outcome"]["garbage"] > 0
    assert stats["requests"] <= 4 * ledger.sent  # 1 attempt + at most 3 retries per request
    assert sum(a.usage.attempts for a in labels) == ledger.sent + ledger.retries  # each row's sends, retries too
    assert max(a.usage.attempts for a in labels) > 1

    # Rerun without faults: requests are sent only for the items that ended UNKNOWN (failed or unparseable).
    unknown_pairs = [pairs[i] for i, a in enumerate(labels) if a.label == "UNKNOWN"]
    server.configure(rules=CURIO_RULES, record=True)
    again = make_backend(cfg, role="annotator")
    relabelled = annotate_preferences(again, pairs, "stairs", "reworded", sampling_from_config(cfg))
    again.close()
    log = server.stats()["log"]
    assert 0 < again.ledger.sent <= len(log) and again.ledger.sent <= 2 * len(unknown_pairs)
    assert all(any(a in text and b in text for a, b in unknown_pairs) for text, _ in log)
    assert all(relabelled[i][:2] == labels[i][:2] for i in range(len(pairs)) if labels[i].label != "UNKNOWN")
    assert [a.label for a in relabelled if a.label != "UNKNOWN"]


def test_oni_labels_over_http(server, key, cache_dir):
    server.configure(rules=CURIO_RULES)
    backend = make_backend(cfg_for(server), role="labeller")
    messages = [f"You find {i} gold pieces." for i in range(30)] + [""]
    out = label_messages(backend, messages, Sampling(max_tokens=64, seed=0))
    backend.close()
    assert out[-1] == ("unhelpful", "", Usage())
    assert {a.label for a in out} == {"helpful", "unhelpful", "UNKNOWN"}
    assert all("helpful" in a.raw for a in out if a.label == "UNKNOWN")  # the word alone did not count
    assert backend.ledger.unknowns == sum(a.label == "UNKNOWN" for a in out)


def test_api_key_stays_out_of_cache_logs_params_and_metrics(server, key, cache_dir, caplog, capsys):
    server.configure(error_rate=0.3, garbage_rate=0.2, rules=CURIO_RULES)
    params = Params.model_validate({"annotate_text": {"judge": cfg_for(server).model_dump()}})
    with caplog.at_level(logging.DEBUG):
        backend = make_backend(params.annotate_text.judge, role="judge")
        backend.generate(convs(30, "secret-check"), Sampling())
        metrics = backend.ledger.metrics()
        backend.close()
    assert isinstance(backend, CachedBackend)
    for path in sorted(cache_dir.glob("*")):  # the database, its WAL and shared-memory files
        assert SENTINEL.encode() not in path.read_bytes(), path
    rows = sqlite3.connect(cache_dir / "llm-cache.sqlite").execute("SELECT * FROM responses").fetchall()
    assert rows and SENTINEL not in repr(rows)
    assert SENTINEL not in caplog.text and SENTINEL not in "".join(capsys.readouterr())
    flat = flatten_params(params.model_dump(mode="json"))
    assert flat["annotate_text.judge.api_key_env"] == KEY_ENV and SENTINEL not in repr(flat)
    assert SENTINEL not in repr(metrics)
    with pytest.raises(ValueError):  # a key cannot even be written into params
        LLMConfig(backend="openai", api_key=SENTINEL)
    assert flatten_params({"llm": {"api_key": SENTINEL, "token": SENTINEL}}) == {}


def test_check_role_over_http(server, key, tmp_path):
    server.configure()
    (tmp_path / "params.yaml").write_text("{}")
    overrides = {f"annotate_text.judge.{k}": v for k, v in cfg_for(server).model_dump().items()}
    params = load_params(tmp_path / "params.yaml", overrides)
    report = check_role(params, "judge")
    assert "1 request in" in report and "reply: 'echo " in report and f"${KEY_ENV} (set)" in report
    assert SENTINEL not in report and server.stats()["requests"] == 1
    server.configure(error_rate=1.0)
    with pytest.raises(CheckFailed, match="error: HTTP"):
        check_role(params, "annotate_text.judge")
    with pytest.raises(ValueError, match="no LLM role 'critic'.*environment.*judge"):
        check_role(params, "critic")


@pytest.mark.slow
def test_api_key_absent_from_a_real_mlflow_run(server, key, cache_dir, tmp_path, monkeypatch):
    """A stage run logging an openai judge's params and ledger: the key is nowhere in the MLflow store."""
    from pipeline.core.tracking import stage_run

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    server.configure(rules=CURIO_RULES)
    params = Params.model_validate({"annotate_text": {"judge": cfg_for(server).model_dump()}})
    backend = make_backend(params.annotate_text.judge, role="judge")
    backend.generate(convs(5), Sampling())
    backend.close()
    with stage_run("annotate-text", params.model_dump(mode="json"), experiment="keycheck") as tracker:
        tracker.log_metrics(backend.ledger.metrics("judge"))
    import mlflow

    run = mlflow.search_runs(experiment_names=["keycheck"], output_format="list")[0]
    assert run.data.params["annotate_text.judge.api_key_env"] == KEY_ENV
    assert run.data.metrics["judge_sent"] == 5
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SENTINEL.encode() not in path.read_bytes(), path


def test_llm_check_fails_fast_on_a_dead_server_with_one_line(tmp_path):
    """One attempt (no retries), one line on stderr naming the URL, exit 1; the policy is a role too."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "llm", "check", "judge",
                          "-S", "annotate_text.judge.backend=openai", "-S", "annotate_text.judge.model=m",
                          "-S", f"annotate_text.judge.base_url=http://127.0.0.1:{port}/v1"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 3
    [line] = res.stderr.strip().splitlines()
    assert line.startswith("curio: llm") and f"127.0.0.1:{port}" in line
    assert "did not answer any of 1 request" in line and "connection" in line
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "llm", "check", "policy", "-S",
                          "policy.backend=scripted", "-S", "policy.model=scripted:0.3"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "scripted" in res.stdout
