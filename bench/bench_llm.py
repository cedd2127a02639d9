"""LLM layer throughput against a local OpenAI-compatible server, cold vs warm cache, and NLE message dedup.

    python bench/bench_llm.py [--latency 0.05] [--waves 20] [--nle-steps 20000]

1. Throughput of the openai backend (through the cache wrapper, cold cache) at concurrency C ∈ {8, 64, 256}
   against the fake server answering after L seconds, printed as a ratio to the limit C / L, side by side with
   a bare aiohttp client (no SDK, no cache: ``bare``), the most this machine allows any Python client. Each is
   also run at L = 0, which gives what the CPUs allow
   at all, with the CPU time the client process and the server process spend per request (from the OS), and
   the ceiling those imply on idle cores: 1000 / max(client ms, server ms, (client + server ms) / ncpu) req/s.
2. The same batch again with the cache warm: requests the server saw (must be 0) and the speed-up.
3. Dedup on real NetHack messages from a random policy: unique / total, and the requests ONI-style labelling
   of that stream really sends.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fake_openai_server import CURIO_RULES, FakeServer  # noqa: E402

from pipeline.llm import CachedBackend, ResponseCache, make_backend  # noqa: E402
from pipeline.llm.base import Sampling  # noqa: E402
from pipeline.llm.config import LLMConfig  # noqa: E402
from pipeline.nethack.annotation import label_messages  # noqa: E402

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


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Meter:
    """Wall time, this process's CPU and the server's CPU over a block, per request."""

    def __init__(self, server: FakeServer, n: int) -> None:
        self.server, self.n = server, n

    def __enter__(self) -> Meter:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        self.server_cpu = process_cpu_s(self.server.proc.pid)
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = (time.process_time() - self.cpu) / self.n * 1000
        self.server_cpu = (process_cpu_s(self.server.proc.pid) - self.server_cpu) / self.n * 1000
        self.rate = self.n / self.wall


def make(server: FakeServer, concurrency: int, cache: ResponseCache) -> CachedBackend:
    return make_backend(cfg(server, concurrency), role="bench", cache=cache)


def bare_rate(server: FakeServer, concurrency: int, n: int, tag: str) -> Meter:
    """Requests/s of a bare aiohttp client (no SDK, no cache): what this machine allows without our layer."""
    import aiohttp

    async def run() -> Meter:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

            async def work(todo) -> None:
                for i in todo:
                    body = {"model": "fake-model", "messages": [{"role": "user", "content": f"bare {tag} {i}"}]}
                    async with session.post(server.base_url + "/chat/completions", json=body) as resp:
                        await resp.json()

            warmup = iter(range(-concurrency, 0))
            await asyncio.gather(*(work(warmup) for _ in range(concurrency)))  # open the connections
            todo = iter(range(n))
            with Meter(server, n) as m:
                await asyncio.gather(*(work(todo) for _ in range(concurrency)))
            return m

    return asyncio.run(run())


def throughput(server: FakeServer, latency: float, waves: int, cache_root: Path) -> None:
    print(f"== throughput, L = {latency * 1000:.0f} ms, {waves} waves of C requests each ==")
    print("ratio = req/s / (C/L). curio = the openai backend (official SDK client) through the cache wrapper, cold")
    print("cache; bare = an aiohttp client, no SDK, no cache. L=0 columns: req/s, and")
    print("CPU ms per request of this process (client) and of the server process; ceiling = the req/s those allow")
    print(f"on {os.cpu_count()} idle cores, one core at most per process: 1000 / max(cli, srv, (cli + srv) / ncpu).")
    print(
        f"{'C':>5} {'C/L':>6} {'client':>6} {'req/s':>7} {'ratio':>6} | {'L=0 req/s':>9} {'cli ms':>6}"
        f" {'srv ms':>6} {'ceiling':>7} | {'warm s':>7} {'warm sent':>9}"
    )
    ncpu = os.cpu_count() or 1
    for c in CONCURRENCY:
        n = c * waves
        n_cpu = max(n, 2000)  # enough requests for the OS's 10 ms CPU accounting ticks
        limit = c / latency
        for kind in ("curio", "bare"):
            if kind == "bare":
                server.configure(latency_s=0.0)
                cpu = bare_rate(server, c, n_cpu, "cpu")
                server.configure(latency_s=latency)
                lat = bare_rate(server, c, n, "lat")
                warm_text = ""
            else:
                cache = ResponseCache(cache_root / f"{kind}{c}.sqlite")
                backend = make(server, c, cache)
                server.configure(latency_s=0.0)
                timed(backend, batch(c, f"warmup{c}"))  # open the connections
                with Meter(server, n_cpu) as cpu:
                    timed(backend, batch(n_cpu, f"cpu{c}"))
                server.configure(latency_s=latency)
                with Meter(server, n) as lat:
                    timed(backend, batch(n, f"lat{c}"))
                server.configure(latency_s=latency)  # zero the counters
                warm = timed(backend, batch(n, f"lat{c}"))
                warm_text = f"{warm:>7.3f} {server.stats()['requests']:>9}"
                backend.close()
            # Each process runs on one core at most; together they share ncpu.
            ceiling = 1000 / max(cpu.cpu, cpu.server_cpu, (cpu.cpu + cpu.server_cpu) / ncpu)
            print(
                f"{c:>5} {limit:>6.0f} {kind:>6} {lat.rate:>7.0f} {lat.rate / limit:>6.2f} | {cpu.rate:>9.0f}"
                f" {cpu.cpu:>6.3f} {cpu.server_cpu:>6.3f} {ceiling:>7.0f} | {warm_text}",
                flush=True,
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
        f" UNKNOWN {sum(a.label == 'UNKNOWN' for a in labels)}"
    )
    print("(UNKNOWNs: by design a third of the fake server's label answers cannot be parsed)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--waves", type=int, default=20)
    ap.add_argument("--nle-steps", type=int, default=20000)
    args = ap.parse_args()
    print(
        f"cpus: {os.cpu_count()}  load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
        f"  python {sys.version.split()[0]}"
    )
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
