"""Bootstrap-style SFT of the built-in model with TRL's default gradient checkpointing vs without, side by side.

    python bench/bench_train.py [--episodes 256] [--epochs 1]

Trains the same tiny GPT-2 on the same scripted conversations twice (padding-free batches, as bootstrap does) and
prints CPU seconds of each, their ratio, and whether the two trained models are bitwise identical (recomputing the
forward pass in backward must not change a gradient, only cost time).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch

from pipeline.envs.base import make_game
from pipeline.models import tiny, training
from pipeline.params import load_params
from stages.bootstrap import scripted_episode


def train(conversations, tokenizer, cfg, checkpointing: bool) -> tuple[float, dict[str, torch.Tensor], list[dict]]:
    original = training._common_args

    def args(*a, **k):
        return {**original(*a, **k), "gradient_checkpointing": checkpointing}

    training._common_args = args
    try:
        model = tiny.build_model(tokenizer, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_positions, seed=0)
        with tempfile.TemporaryDirectory() as tmp:
            c0 = time.process_time()
            model, history, _ = training.sft_train(model, tokenizer, conversations, Path(tmp), lr=cfg.lr,
                                                   epochs=cfg.epochs, batch_size=cfg.batch_size, seed=0,
                                                   save_steps=10_000, padding_free=True)
            cpu = time.process_time() - c0
    finally:
        training._common_args = original
    return cpu, {k: v.clone() for k, v in model.state_dict().items()}, history


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--epochs", type=float, default=1.0)
    args = ap.parse_args()
    cfg = load_params("params.yaml").bootstrap.model_copy(update={"epochs": args.epochs})
    game = make_game("twenty_questions")
    tasks = game.tasks("train")
    rng = random.Random(0)
    conversations = [scripted_episode(game, tasks[rng.randrange(len(tasks))], rng, cfg.noise)
                     for _ in range(args.episodes)]
    tokenizer = tiny.train_tokenizer([m["content"] for c in conversations for m in c], cfg.vocab_size)
    cpu_on, w_on, h_on = train(conversations, tokenizer, cfg, checkpointing=True)
    cpu_off, w_off, h_off = train(conversations, tokenizer, cfg, checkpointing=False)
    same = all(torch.equal(w_on[k], w_off[k]) for k in w_on)
    print(f"{args.episodes} episodes, {args.epochs} epochs, {len(h_on)} logged losses")
    print(f"gradient checkpointing on : {cpu_on:7.1f} CPU s")
    print(f"gradient checkpointing off: {cpu_off:7.1f} CPU s")
    print(f"ratio on/off: {cpu_on / cpu_off:.2f}x   trained weights bitwise identical: {same}   "
          f"loss histories identical: {h_on == h_off}")


if __name__ == "__main__":
    main()
