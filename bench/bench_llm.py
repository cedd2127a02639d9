"""LLM layer throughput against a local OpenAI-compatible server, cold vs warm cache, and NLE message dedup.

    python bench/bench_llm.py [--latency 0.05] [--waves 20] [--nle-steps 20000]

1. Throughput of the openai backend (through the cache wrapper, cold cache) at concurrency C ∈ {8, 64, 256}
   against the fake server answering after L seconds, printed as a ratio to the limit C / L. The same run at
   L = 0 gives what this machine's CPUs allow at all (client + server in Python), printed next to it.
2. The same batch again with the cache warm: requests the server saw (must be 0) and the speed-up.
3. Dedup on real NetHack messages from a random policy: unique / total, and the requests ONI-style labelling
   of that stream really sends.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fake_openai_server import CURIO_RULES, FakeServer  # noqa: E402

from pipeline.config import LLMConfig  # noqa: E402
from pipeline.llm import ResponseCache, make_backend  # noqa: E402
from pipeline.llm.annotation import label_messages  # noqa: E402
from pipeline.llm.base import Sampling  # noqa: E402

CONCURRENCY = (8, 64, 256)


def cfg(server: FakeServer, concurrency: int) -> LLMConfig:
    return LLMConfig(
        backend="openai",
        model="fake-model",
        base_url=server.base_url,
        max_concurrency=concurrency,
        timeout_s=30,
        max_retries=2,
        max_tokens=16,
    )


def batch(n: int, tag: str) -> list[list[dict]]:
    return [[{"role": "user", "content": f"{tag} request {i}"}] for i in range(n)]


def timed(backend, conversations) -> float:
    start = time.perf_counter()
    out = backend.generate(conversations, Sampling(max_tokens=16))
    elapsed = time.perf_counter() - start
    assert all(g.error is None for g in out), [g.error for g in out if g.error][:3]
    return elapsed


def bare_rate(server: FakeServer, concurrency: int, n: int) -> float:
    """Requests/s of a bare aiohttp client (no SDK, no cache): what this machine allows without our layer."""
    import asyncio

    import aiohttp

    async def run() -> float:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

            async def work(todo) -> None:
                for i in todo:
                    body = {"model": "fake-model", "messages": [{"role": "user", "content": f"bare {i}"}]}
                    async with session.post(server.base_url + "/chat/completions", json=body) as resp:
                        await resp.json()

            warmup = iter(range(concurrency))
            await asyncio.gather(*(work(warmup) for _ in range(concurrency)))  # open the connections
            todo = iter(range(n))
            start = time.perf_counter()
            await asyncio.gather(*(work(todo) for _ in range(concurrency)))
            return n / (time.perf_counter() - start)

    return asyncio.run(run())


def throughput(server: FakeServer, latency: float, waves: int, cache_root: Path) -> None:
    print(f"== throughput, L = {latency * 1000:.0f} ms, {waves} waves of C requests each ==")
    print("ratio = req/s / (C/L). curio = openai backend through the cache wrapper, cold cache; bare = an aiohttp")
    print("client with no SDK and no cache; cpu = the same curio run with L = 0, i.e. what the CPUs allow at all.")
    print(
        f"{'C':>5} {'C/L':>6} {'curio req/s':>11} {'ratio':>6} {'bare req/s':>10} {'ratio':>6} {'cpu req/s':>9}"
        f" {'cold s':>7} {'warm s':>7} {'warm sent':>9}"
    )
    for c in CONCURRENCY:
        n = c * waves
        server.configure(latency_s=0.0)
        cache = ResponseCache(cache_root / f"c{c}.sqlite")
        backend = make_backend(cfg(server, c), role="bench", cache=cache)
        timed(backend, batch(c, f"warmup{c}"))  # open the connections
        cpu = n / timed(backend, batch(n, f"cpu{c}"))

        server.configure(latency_s=latency)
        cold = timed(backend, batch(n, f"lat{c}"))
        server.configure(latency_s=latency)  # zero the counters
        warm = timed(backend, batch(n, f"lat{c}"))
        warm_sent = server.stats()["requests"]
        backend.close()
        bare = bare_rate(server, c, n)
        limit = c / latency
        print(
            f"{c:>5} {limit:>6.0f} {n / cold:>11.0f} {n / cold / limit:>6.2f} {bare:>10.0f} {bare / limit:>6.2f}"
            f" {cpu:>9.0f} {cold:>7.3f} {warm:>7.3f} {warm_sent:>9}"
        )


def nle_messages(steps: int, seed: int) -> list[str]:
    import gymnasium as gym
    import nle  # noqa: F401 - registers the NetHack environments
    import numpy as np

    env = gym.make("NetHackScore-v0")
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    messages = []
    for _ in range(steps):
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        messages.append(bytes(obs["message"]).rstrip(b"\0").decode(errors="replace"))
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return messages


def dedup(server: FakeServer, steps: int, cache_root: Path) -> None:
    print(f"== dedup on NLE messages, random policy, {steps} steps ==")
    start = time.perf_counter()
    messages = nle_messages(steps, seed=0)
    step_s = time.perf_counter() - start
    nonempty = [m for m in messages if m.strip()]
    unique = set(nonempty)
    print(
        f"steps/s {steps / step_s:.0f}; messages {len(nonempty)} non-empty of {len(messages)} steps;"
        f" unique {len(unique)}; unique/total {len(unique) / max(1, len(nonempty)):.4f}"
        f" ({len(nonempty) / max(1, len(unique)):.0f}x repetition)"
    )
    server.configure(latency_s=0.05, rules=CURIO_RULES)
    backend = make_backend(cfg(server, 64), role="labeller", cache=ResponseCache(cache_root / "nle.sqlite"))
    start = time.perf_counter()
    labels = label_messages(backend, messages, Sampling(max_tokens=16, seed=0))
    elapsed = time.perf_counter() - start
    backend.close()
    m = backend.ledger.metrics("")
    print(
        f"ONI labelling of all {len(messages)} steps: {elapsed:.2f} s,"
        f" server requests {server.stats()['requests']},"
        f" ledger requests {m['requests']} unique {m['unique_requests']} sent {m['sent']};"
        f" UNKNOWN {sum(lab == 'UNKNOWN' for lab, _ in labels)}"
    )
    print("(UNKNOWNs: by design a third of the fake server's label answers cannot be parsed)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--waves", type=int, default=20)
    ap.add_argument("--nle-steps", type=int, default=20000)
    args = ap.parse_args()
    print(f"cpus: {os.cpu_count()}  python {sys.version.split()[0]}")
    server = FakeServer()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            throughput(server, args.latency, args.waves, Path(tmp))
            if args.nle_steps:
                dedup(server, args.nle_steps, Path(tmp))
    finally:
        server.close()


if __name__ == "__main__":
    main()
