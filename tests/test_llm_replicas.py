"""The openai backend over several loopback servers: least outstanding requests, a killed replica skipped."""

import logging
import socket
import threading
import time

import pytest
from fake_openai_server import FakeServer

from pipeline.llm import make_backend
from pipeline.llm.base import Sampling
from pipeline.llm.config import LLMConfig
from pipeline.llm.openai_backend import OpenAIBackend


@pytest.fixture
def servers():
    pair = [FakeServer(), FakeServer()]
    yield pair
    for s in pair:
        s.close()


def convs(n, tag="q"):
    return [[{"role": "user", "content": f"{tag} {i}"}] for i in range(n)]


def backend_for(urls, **kw) -> OpenAIBackend:
    values = dict(max_concurrency=4, timeout_s=2.0, max_retries=3, backoff_s=0.01, cooldown_s=0.3)
    values.update(kw)
    return OpenAIBackend("fake-model", urls, **values)


def test_params_take_a_list_and_spread_requests_over_both_servers(servers, tmp_path):
    for s in servers:
        s.configure(latency_s=0.05)
    cfg = LLMConfig(
        backend="openai", model="fake-model", base_url=[s.base_url for s in servers], max_concurrency=4, cache=False
    )
    backend = make_backend(cfg, role="judge")
    out = backend.generate(convs(48), Sampling())
    backend.close()
    stats = [s.stats() for s in servers]
    assert all(g.error is None and g.text.startswith("echo ") for g in out)
    assert sum(st["requests"] for st in stats) == 48
    # Each server is used and never gets more than max_concurrency at once: the cap is per server.
    assert all(st["requests"] >= 16 and 2 <= st["max_in_flight"] <= 4 for st in stats), stats


def test_least_outstanding_sends_more_to_the_faster_server(servers):
    slow, fast = servers
    slow.configure(latency_s=0.4)
    fast.configure(latency_s=0.02)
    backend = backend_for([slow.base_url, fast.base_url])
    out = backend.generate(convs(120), Sampling())
    backend.close()
    assert all(g.error is None for g in out)
    n_slow, n_fast = slow.stats()["requests"], fast.stats()["requests"]
    assert n_slow + n_fast == 120 and n_fast > 4 * n_slow, (n_slow, n_fast)


def test_a_killed_server_is_skipped_and_tried_again_after_its_cooldown(servers, caplog):
    survivor, victim = servers
    survivor.configure(latency_s=0.05)
    victim.configure(latency_s=0.05)
    # Cool-downs double while it stays dead; backoff_max_s caps them so the revival below is seen soon.
    backend = backend_for([survivor.base_url, victim.base_url], backoff_max_s=0.5)
    result: list = []
    runner = threading.Thread(target=lambda: result.extend(backend.generate(convs(160, "run"), Sampling())))
    with caplog.at_level(logging.WARNING, logger="pipeline.llm.openai_backend"):
        runner.start()
        time.sleep(0.5)  # both serve for a while ...
        victim.proc.kill()  # ... then one dies with requests in flight
        victim.proc.wait()
        runner.join(timeout=60)
    assert not runner.is_alive()
    assert len(result) == 160 and all(g.error is None and g.text.startswith("echo ") for g in result)
    assert any("skipped" in r.getMessage() and victim.base_url in r.getMessage() for r in caplog.records)
    served_by_survivor = survivor.stats()["requests"]
    assert 80 < served_by_survivor < 160  # the victim had served some before it died, the survivor the rest

    # Back at the same address: once its cool-down has passed, it gets requests again.
    revived = FakeServer(port=victim.port)
    try:
        revived.configure(latency_s=0.05)
        time.sleep(0.6)
        out = backend.generate(convs(40, "after"), Sampling())
        assert all(g.error is None for g in out)
        assert revived.stats()["requests"] >= 10
    finally:
        backend.close()
        revived.close()


def test_all_servers_down_fails_every_request_in_bounded_time():
    ports = []
    for _ in range(2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    backend = backend_for([f"http://127.0.0.1:{p}/v1" for p in ports], max_retries=2, cooldown_s=0.1, backoff_max_s=0.2)
    start = time.monotonic()
    out = backend.generate(convs(6), Sampling())
    backend.close()
    assert time.monotonic() - start < 10
    assert all(g.text == "" and g.error.startswith("connection error") and g.meta["retries"] == 2 for g in out)


def test_an_empty_list_of_servers_is_a_clear_error():
    with pytest.raises(ValueError, match="base_url is an empty list"):
        OpenAIBackend("fake-model", [])
