"""Bootstrap-style SFT of the built-in model two ways, side by side.

    python bench/bench_train.py [--compare checkpointing|packed] [--episodes 256] [--epochs 1] [--rounds 1]

Trains the same tiny GPT-2 on the same scripted conversations (padding-free batches, as bootstrap does) each way,
alternating for ``--rounds``, and prints the CPU and wall seconds of each, their ratio, and how far apart the two
trained models are:
- ``checkpointing``: TRL's default gradient checkpointing vs without. Recomputing the forward pass in backward must
  not change a gradient, only cost time: the weights should be bitwise identical.
- ``packed``: transformers' SDPA over the whole packed row (one block-diagonal mask) vs
  ``pipeline.models.attention``'s causal SDPA per conversation. The same arithmetic up to float rounding: the
  weights differ by rounding only (the largest difference is printed) and the losses agree to about 6 digits.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import AttentionInterface

from pipeline.envs.base import make_game
from pipeline.models import tiny, training
from pipeline.models.attention import sdpa_attention_gqa
from pipeline.params import load_params
from stages.bootstrap import scripted_episode


def train(conversations, tokenizer, cfg, checkpointing: bool = False, packed: bool = True):
    """CPU seconds, wall seconds, the trained weights and the loss history of one bootstrap-style SFT."""
    original = training._common_args

    def args(*a, **k):
        return {**original(*a, **k), "gradient_checkpointing": checkpointing}

    training._common_args = args
    AttentionInterface.register("sdpa", sdpa_attention_gqa if packed else sdpa_attention_forward)
    try:
        model = tiny.build_model(tokenizer, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_positions, seed=0)
        with tempfile.TemporaryDirectory() as tmp:
            c0, t0 = time.process_time(), time.perf_counter()
            model, history, _ = training.sft_train(model, tokenizer, conversations, Path(tmp), lr=cfg.lr,
                                                   epochs=cfg.epochs, batch_size=cfg.batch_size, seed=0,
                                                   save_steps=10_000, padding_free=True)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    finally:
        training._common_args = original
        AttentionInterface.register("sdpa", sdpa_attention_gqa)
    return cpu, wall, {k: v.clone() for k, v in model.state_dict().items()}, history


WAYS = {  # --compare: (label, keyword arguments of train()) for each side
    "checkpointing": (("gradient checkpointing on", {"checkpointing": True}),
                      ("gradient checkpointing off", {"checkpointing": False})),
    "packed": (("one mask over the packed row", {"packed": False}),
               ("causal SDPA per conversation", {"packed": True})),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compare", choices=list(WAYS), default="checkpointing")
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=1, help="alternate the two ways this many times")
    args = ap.parse_args()
    cfg = load_params("params.yaml").bootstrap.model_copy(update={"epochs": args.epochs})
    game = make_game("twenty_questions")
    tasks = game.tasks("train")
    rng = random.Random(0)
    conversations = [scripted_episode(game, tasks[rng.randrange(len(tasks))], rng, cfg.noise)
                     for _ in range(args.episodes)]
    tokenizer = tiny.train_tokenizer([m["content"] for c in conversations for m in c], cfg.vocab_size)
    sides = WAYS[args.compare]
    runs: dict[str, list] = {label: [] for label, _ in sides}
    for _ in range(args.rounds):
        for label, kwargs in sides:
            runs[label].append(train(conversations, tokenizer, cfg, **kwargs))
    (a, runs_a), (b, runs_b) = runs.items()
    print(f"{args.episodes} episodes, {args.epochs} epochs, {len(runs_a[0][3])} logged losses, "
          f"{args.rounds} round(s), {torch.get_num_threads()} torch threads")
    for label, rs in runs.items():
        cpu, wall = " ".join(f"{r[0]:.1f}" for r in rs), " ".join(f"{r[1]:.1f}" for r in rs)
        print(f"{label:<30}: CPU s {cpu}   wall s {wall}")
    cpu_ratio = sum(r[0] for r in runs_a) / sum(r[0] for r in runs_b)
    wall_ratio = sum(r[1] for r in runs_a) / sum(r[1] for r in runs_b)
    w_a, w_b, h_a, h_b = runs_a[0][2], runs_b[0][2], runs_a[0][3], runs_b[0][3]
    diff = max((w_a[k] - w_b[k]).abs().max().item() for k in w_a)
    loss_gap = max(abs(x["loss"] - y["loss"]) for x, y in zip(h_a, h_b, strict=True))
    print(f"ratio {a} / {b}: CPU {cpu_ratio:.2f}x, wall {wall_ratio:.2f}x")
    print(f"trained weights bitwise identical: {all(torch.equal(w_a[k], w_b[k]) for k in w_a)} "
          f"(largest difference {diff:.2e});  loss histories identical: {h_a == h_b} "
          f"(largest gap {loss_gap:.2e})")


if __name__ == "__main__":
    main()
