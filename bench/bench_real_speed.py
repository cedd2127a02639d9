"""Real-model speed: SmolLM2-135M playing the tiers batched in the hf backend, against llama.cpp and the machine.

    OMP_NUM_THREADS=2 python bench/bench_real_speed.py [--batch 32 64] [--preset PRESET] [--no-llama]
                                                       [--vllm [--vllm-args ...]]
                                                       [--drop-finished 0 0.25] [--dtype float32 bfloat16]
                                                       [--sdpa transformers gqa] [--cpu-linear torch onednn]

1. **The machine's limit.** torch's matmul throughput measured here in each ``--dtype`` (GFLOP/s, the best of the
   shapes the model's own layers run at batch × tokens, and one square 1024³), and the model's FLOPs per token
   (2 × the weights a token passes through, the tied LM head included, + attention over the mean context):
   limit tokens/s = throughput ÷ FLOPs per token. A run in bfloat16 is measured against both limits: float32's
   and bfloat16's own (the machine's best, where it has bf16 instructions).
2. **Curio's hf backend.** Multi-turn batched play (``play_episodes``, the preset's rollout sampling, its tiers'
   train tasks, KV cache kept across turns) at each ``--batch`` with as many episodes: tokens processed per
   second (prompt tokens run through the model + generated) and generated per second; at each
   ``--drop-finished`` (``policy.drop_finished``: finished rows leave the batch), ``--dtype`` (``policy.dtype``:
   the weights' dtype) and ``--sdpa`` (``gqa``: Curio's SDPA function, reading shared key / value heads in place,
   ``pipeline.models.attention``; ``transformers``: the library's own, copying them per query head), with the
   share of decode row-steps that generated a reply's token, and the turns per second against the first
   combination; and at each ``--cpu-linear`` (``policy.cpu_linear``: the float32 linear layers' GEMM, torch's
   default or oneDNN with reordered weights, whose own matmul throughput is measured too: the limit of a oneDNN
   run is the best of both). Runs at the same dtype play the same tokens whatever ``--sdpa`` says (it prints
   whether each run played the first one's conversations).
3. **llama.cpp's server** (the same model as its GGUF, ``make server``) driven directly with the openai client
   at the same concurrency, on the same requests: every turn's conversation as the hf run played it, turn by turn,
   with the same ``max_tokens``; its own ``usage`` counts the tokens.

4. **vLLM's server** (``--vllm``; ``make vllm``, started as ``backend: vllm`` starts it, in the first ``--dtype``)
   replaying the same turns the same way (no per-request seed: vLLM's CPU engine dies on one).

Prints processed tokens/s ÷ the limit (goal ≥ 0.5 at batch ≥ 32) and hf ÷ llama.cpp (goal ≥ 1: not slower),
both for tokens processed per second and for requests (turns) completed per second.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from functools import partial
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def matmul_gflops(shapes: list[tuple[int, int, int]], seconds: float = 1.0, dtype: torch.dtype = torch.float32,
                  onednn: bool = False) -> dict[tuple[int, int, int], float]:
    """GFLOP/s of ``a @ b`` in ``dtype`` for each (m, k, n), each run for about ``seconds``; ``onednn``: as a
    float32 linear layer through oneDNN with ``b`` reordered once (``policy.cpu_linear: onednn``)."""
    from pipeline.models.linear import _linear

    out = {}
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        if onednn:
            mul = partial(_linear, a, torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), None), None)
        else:
            mul = partial(torch.matmul, a, b)
        for _ in range(3):
            mul()
        reps, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < seconds:
            mul()
            reps += 1
        out[(m, k, n)] = 2 * m * k * n * reps / elapsed / 1e9
    return out


def flops_per_token(config, context: float) -> float:
    """2 × weights a token passes through (attention and MLP of every layer, the LM head) + attention scores
    and values over ``context`` earlier tokens (2 × 2 × context × heads × head_dim per layer)."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    head_dim = h // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * inter  # q, k, v, o; gate, up, down
    weights = layers * per_layer + h * config.vocab_size
    return 2 * weights + layers * 4 * context * config.num_attention_heads * head_dim


def hf_play(params, batch: int, drop_finished: float, dtype: str = "float32", sdpa: str = "gqa",
            cpu_linear: str = "torch"):
    """Multi-turn play of ``batch`` episodes in one batch; (seconds, backend, rows, sampling, decode row-steps:
    rows × steps of every ``generate`` call, finished rows padded along included)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import AttentionInterface

    from pipeline.models.attention import sdpa_attention_gqa

    AttentionInterface.register("sdpa", sdpa_attention_gqa if sdpa == "gqa" else sdpa_attention_forward)
    try:
        return _hf_play(params, batch, drop_finished, dtype, cpu_linear)
    finally:
        AttentionInterface.register("sdpa", sdpa_attention_gqa)  # what pipeline.llm.hf installs


def _hf_play(params, batch: int, drop_finished: float, dtype: str, cpu_linear: str):
    from pipeline.llm import sampling_from_config
    from pipeline.text.play import play_episodes
    from pipeline.text.policies import game_tasks, load_policy_backend, make_games

    games = make_games(params)
    pool = [(g, t) for g in games for t in game_tasks(params.games, g, "train")]
    jobs = [(g, t, i // len(pool)) for i, (g, t) in enumerate(pool[i % len(pool)] for i in range(batch))]
    backend = load_policy_backend(params.model_copy(update={"policy": params.policy.model_copy(
        update={"drop_finished": drop_finished, "dtype": dtype, "cpu_linear": cpu_linear})}), "base",
        batch_size=batch)
    sampling = sampling_from_config(params.rollout_text)
    backend.generate([[{"role": "user", "content": "Hi"}]], sampling)  # load and warm up, not timed
    backend.prompt_tokens = backend.generated_tokens = 0
    row_steps = [0]
    generate = backend.lm.generate

    def counted(*args, **kwargs):
        out = generate(*args, **kwargs)
        row_steps[0] += out.sequences.shape[0] * (out.sequences.shape[1] - kwargs["input_ids"].shape[1])
        return out

    backend.lm.generate = counted
    t0 = time.perf_counter()
    rows = play_episodes(backend, jobs, sampling, seed=0, max_format_retries=params.rollout_text.max_format_retries)
    return time.perf_counter() - t0, backend, rows, sampling, row_steps[0]


def turn_requests(rows: list[dict]) -> list[list[list[dict]]]:
    """Per turn, the conversations the policy answered (each episode's prefix up to that assistant turn)."""
    turns: list[list[list[dict]]] = []
    for row in rows:
        conv = [dict(m) for m in row["conversation"]]
        t = 0
        for i, m in enumerate(conv):
            if m["role"] == "assistant":
                if len(turns) <= t:
                    turns.append([])
                turns[t].append(conv[:i])
                t += 1
    return turns


def replay(base_url: str, model: str, turns, sampling, concurrency: int, seed: bool = True) -> dict:
    """Every turn's requests to an OpenAI-compatible server, turn by turn, ``concurrency`` in flight; seconds and
    the server's usage totals. ``seed``: send one (vLLM's CPU engine dies on it)."""
    from openai import AsyncOpenAI

    async def run() -> dict:
        client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
        sem = asyncio.Semaphore(concurrency)
        totals = {"prompt": 0, "completion": 0, "requests": 0}

        async def one(conversation):
            async with sem:
                r = await client.chat.completions.create(
                    model=model, messages=conversation, max_tokens=sampling.max_tokens,
                    temperature=sampling.temperature, top_p=sampling.top_p, **({"seed": 0} if seed else {}),
                    extra_body={"min_p": sampling.min_p})
                totals["prompt"] += r.usage.prompt_tokens
                totals["completion"] += r.usage.completion_tokens
                totals["requests"] += 1

        await one(turns[0][0])  # warm up, not counted
        totals.update(prompt=0, completion=0, requests=0)
        t0 = time.perf_counter()
        for batch in turns:
            await asyncio.gather(*(one(c) for c in batch))
        totals["seconds"] = time.perf_counter() - t0
        await client.close()
        return totals

    return asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="presets/smollm2-learn.yaml")
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp (when `make server` has not run)")
    ap.add_argument("--vllm", action="store_true", help="also vLLM's server (`make vllm`), in the first --dtype, "
                    "replaying the same turns")
    ap.add_argument("--vllm-args", nargs="+", default=[], help="more arguments for vLLM's server, e.g. "
                    "--no-enforce-eager (torch.compile on a CPU)")
    ap.add_argument("--drop-finished", type=float, nargs="+", default=[0.0, 0.25],
                    help="policy.drop_finished values to play at, side by side (the first is the baseline)")
    ap.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "bfloat16"],
                    help="policy.dtype values to play at, side by side with each drop-finished value")
    ap.add_argument("--sdpa", nargs="+", default=["gqa"], choices=["transformers", "gqa"],
                    help="SDPA functions to play with, side by side: Curio's (shared key / value heads read in "
                         "place) or transformers' own (copied per query head)")
    ap.add_argument("--cpu-linear", nargs="+", default=["torch"], choices=["torch", "onednn"],
                    help="policy.cpu_linear values to play at, side by side: the float32 linear layers' GEMM")
    args = ap.parse_args()
    import os

    os.environ.setdefault("TQDM_DISABLE", "1")
    from transformers import AutoConfig

    from pipeline.core.config import preset_overrides
    from pipeline.models.gguf import resolve_model
    from pipeline.params import load_params

    params = load_params("params.yaml", [*preset_overrides(args.preset), "tracking.enabled=false"])
    config = AutoConfig.from_pretrained(resolve_model(params.policy.model))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}")
    h, inter = config.hidden_size, config.intermediate_size
    shapes = [(m, k, n) for m in (32, 512, 4096) for k, n in ((h, inter), (inter, h), (h, h))] + [(1024, 1024, 1024)]
    peaks = {}
    for dtype in dict.fromkeys(["float32", *args.dtype]):
        gflops = matmul_gflops(shapes, dtype=getattr(torch, dtype))
        for shape, g in gflops.items():
            print(f"{dtype} matmul {shape[0]:>5} x {shape[1]:>5} x {shape[2]:>5}: {g:7.1f} GFLOP/s")
        peaks[dtype] = max(gflops.values())
    if "onednn" in args.cpu_linear:  # the limit of a run through oneDNN: the best of both GEMMs
        gflops = matmul_gflops(shapes, onednn=True)
        for shape, g in gflops.items():
            print(f"float32 oneDNN (reordered weights) matmul {shape[0]:>5} x {shape[1]:>5} x {shape[2]:>5}: "
                  f"{g:7.1f} GFLOP/s")
        peaks["float32 onednn"] = max(peaks["float32"], *gflops.values())
    server = None
    if not args.no_llama:
        from llama_server import LlamaServer

        threads = str(torch.get_num_threads())  # llama.cpp's default is half the cores: give it what torch has
        server = LlamaServer(extra=("--n_threads", threads, "--n_threads_batch", threads))
    vllm = None
    if args.vllm:
        from pipeline.llm.vllm import VLLMServer

        t0 = time.perf_counter()
        vllm = VLLMServer(resolve_model(params.policy.model), name="policy", dtype=args.dtype[0],
                          extra=tuple(args.vllm_args))
        print(f"vLLM server ({vllm.dtype}) answering after {time.perf_counter() - t0:.0f} s")
    try:
        for batch in args.batch:
            base_rate, r, v = None, None, None
            played = {}  # (dtype, drop_finished) -> the first run's replies
            combos = [(d, a, c, f) for d in args.dtype for a in args.sdpa for c in args.cpu_linear
                      for f in args.drop_finished]
            for dtype, sdpa, linear, drop in combos:
                seconds, backend, rows, sampling, row_steps = hf_play(params, batch, drop, dtype, sdpa, linear)
                replies = [r["conversation"] for r in rows]
                turns = turn_requests(rows)
                requests = sum(len(t) for t in turns)
                processed = backend.prompt_tokens + backend.generated_tokens
                final = sum(len(backend.encode([r["conversation"]])[0]) for r in rows) / len(rows)
                fpt = flops_per_token(config, context=final / 2)
                limits = {d: peak * 1e9 / fpt for d, peak in peaks.items()
                          if d in ("float32", dtype) or (d == "float32 onednn" and linear == "onednn")}
                wins = sum(r["success"] for r in rows) / len(rows)
                print(f"\nbatch {batch}, policy.dtype {dtype}, sdpa {sdpa}, policy.cpu_linear {linear}, "
                      f"policy.drop_finished {drop}: "
                      f"{len(rows)} episodes "
                      f"(won {wins:.1%}), {requests} turns, {final:.0f} tokens per finished conversation; "
                      f"{fpt / 1e6:.0f} MFLOP per token -> limit "
                      + ", ".join(f"{limit:,.0f} tokens/s at {peaks[d]:.0f} GFLOP/s ({d})"
                                  for d, limit in limits.items()))
                print(f"  hf       {seconds:7.1f} s  processed {processed / seconds:8.1f} tok/s "
                      f"(prompt {backend.prompt_tokens}, generated {backend.generated_tokens}: "
                      f"{backend.generated_tokens / seconds:.1f}"
                      f" tok/s)  {requests / seconds:.2f} turns/s")
                print(f"  decode row-steps {row_steps}: {backend.generated_tokens / row_steps:.0%} of them generated "
                      "a reply's token (the rest padded finished rows)")
                for d, limit in limits.items():
                    print(f"  hf / machine limit in {d} (processed tokens/s): {processed / seconds / limit:.2f}"
                          "   (goal >= 0.5)")
                if (dtype, drop) in played:
                    same = played[(dtype, drop)] == replies
                    print(f"  the same conversations as the first run at this dtype: {same}")
                played.setdefault((dtype, drop), replies)
                if base_rate is None:
                    base_rate = requests / seconds
                else:
                    print(f"  turns/s vs policy.dtype {args.dtype[0]}, sdpa {args.sdpa[0]}, cpu_linear "
                          f"{args.cpu_linear[0]}, drop_finished {args.drop_finished[0]}: "
                          f"{requests / seconds / base_rate:.2f}")
                if vllm is not None:
                    if v is None:  # replayed once per batch, on the first combination's turns
                        v = replay(vllm.base_url, vllm.name, turns, sampling, batch, seed=False)
                    vp = (v["prompt"] + v["completion"]) / v["seconds"]
                    print(f"  vLLM     {v['seconds']:6.1f} s  processed {vp:8.1f} tok/s (prompt {v['prompt']}, "
                          f"generated {v['completion']}: {v['completion'] / v['seconds']:.1f} tok/s)  "
                          f"{v['requests'] / v['seconds']:.2f} turns/s")
                    print(f"  hf / vLLM: turns/s {requests / seconds / (v['requests'] / v['seconds']):.2f}, "
                          f"processed tok/s {processed / seconds / vp:.2f}, generated tok/s "
                          f"{backend.generated_tokens / seconds / (v['completion'] / v['seconds']):.2f}")
                if server is not None:
                    if r is None:  # replayed once per batch, on the first combination's turns
                        r = replay(server.base_url, server.model, turns, sampling, batch)
                    lp = (r["prompt"] + r["completion"]) / r["seconds"]
                    print(f"  llama.cpp {r['seconds']:6.1f} s  processed {lp:8.1f} tok/s (prompt {r['prompt']}, "
                          f"generated {r['completion']}: {r['completion'] / r['seconds']:.1f} tok/s)  "
                          f"{r['requests'] / r['seconds']:.2f} turns/s")
                    print(f"  hf / llama.cpp: turns/s {requests / seconds / (r['requests'] / r['seconds']):.2f}, "
                          f"processed tok/s {processed / seconds / lp:.2f}, generated tok/s "
                          f"{backend.generated_tokens / seconds / (r['completion'] / r['seconds']):.2f}   (goal >= 1)")
    finally:
        if server is not None:
            server.close()
        if vllm is not None:
            vllm.close()


if __name__ == "__main__":
    main()
