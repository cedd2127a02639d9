"""train-reward: the Motif message reward model, Bradley-Terry with soft labels on caption text.

Reads ``data/pairs_nethack``; trains ``pipeline.nethack.reward.MessageRewardNet`` on the train split with
``soft_bt_loss`` (ties pull both rewards together, y = 0.5); reports agreement with the annotator on held-out
pairs that have a winner. Each step scores only the distinct captions of its batch — captions repeat heavily,
so that is a fraction of 2 × batch_size network rows.

Output: ``data/reward_model`` — ``model.safetensors`` + ``config.json``; ``stats.json`` with the mean and std of
the raw reward over the training captions (weighted by how often they occur) and the quantiles 0.00…1.00 of
the normalised reward over distinct training captions; ``message_rewards.json``: the normalised reward of every
caption seen, which RL workers load instead of re-running the network. Learning curve:
``metrics/plots/train-reward.csv``.

    curio stage train-reward -S train_reward.epochs=10
"""

from __future__ import annotations

import csv
import json

import numpy as np
import torch

from pipeline.core.artifacts import atomic_write_json, chunk_seed, dataset_hash, read_table
from pipeline.core.checkpoints import finished, mark_finished, run_key
from pipeline.core.stage import Out, Plot, Stage, StageContext, StageResult
from pipeline.nethack.reward import (
    STATS,
    MessageRewardNet,
    RewardNetConfig,
    RewardStats,
    encode_texts,
    save_reward_model,
    soft_bt_loss,
)
from pipeline.nethack.sf import TABLE
from pipeline.params import Params

NAME = "train-reward"
STAGE = Stage(
    NAME,
    params=["seed", "train_reward"],
    code=["pipeline/nethack/reward.py"],
    data=["data/pairs_nethack"],
    outs=[Out("data/reward_model")],
    plots=[Plot("metrics/plots/train-reward.csv", "Reward model, validation agreement", x="epoch", y="val_agreement")],
    models=["reward_model"],
    model_loader="pipeline.nethack.reward:load_reward_model",
    track="nethack",
)
QUANTILE_LEVELS = [round(q, 2) for q in np.linspace(0, 1, 101)]


def agreement(rewards: np.ndarray, first: np.ndarray, second: np.ndarray, y: np.ndarray) -> float:
    """Share of pairs with a winner (y 0 or 1) on which the model ranks the annotator's winner higher."""
    decisive = y != 0.5
    if not decisive.any():
        return float("nan")
    predicted_second = rewards[second[decisive]] > rewards[first[decisive]]
    return float(np.mean(predicted_second == (y[decisive] == 1.0)))


def pair_loss(rewards: torch.Tensor, first: np.ndarray, second: np.ndarray, y: np.ndarray) -> float:
    if len(y) == 0:
        return float("nan")
    return float(soft_bt_loss(rewards[first], rewards[second], torch.from_numpy(y)).item())


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.train_reward
    src, out = params.data_path("pairs_nethack"), params.data_path("reward_model")
    curve_csv = params.plots_path(f"{NAME}.csv")
    # One pass, seconds long: no checkpoints; a model finished under the same params and pairs is kept.
    key = run_key(params.section_hash(STAGE.params), dataset_hash(src))
    if finished(out, key) and curve_csv.exists():
        return StageResult(metrics=json.loads((out / STATS).read_text())["metrics"],
                           outputs=[str(out), str(curve_csv)])
    pairs = read_table(src).to_pandas()
    # One thread: on a shared 2-core machine OpenMP's spinning threads made steps ~40x slower, not faster.
    torch.set_num_threads(1)
    torch.manual_seed(chunk_seed(params.seed, NAME, 0))
    rng = np.random.default_rng(chunk_seed(params.seed, NAME, 1))

    # Every caption once; pairs become index pairs into that list.
    captions = list(dict.fromkeys([*pairs["caption_first"], *pairs["caption_second"]]))
    index = {c: i for i, c in enumerate(captions)}
    first = pairs["caption_first"].map(index).to_numpy()
    second = pairs["caption_second"].map(index).to_numpy()
    y = pairs["y"].to_numpy(dtype=np.float32)
    is_train = (pairs["split"] == "train").to_numpy()
    train = np.flatnonzero(is_train)
    val = np.flatnonzero(~is_train)
    if len(train) == 0:
        raise ValueError("train-reward: no training pairs (did annotate-nethack label everything UNKNOWN?)")

    model = MessageRewardNet(RewardNetConfig(cfg.max_len, cfg.embed_dim, cfg.channels, cfg.hidden))
    tokens = encode_texts(captions, cfg.max_len)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def all_rewards() -> torch.Tensor:
        model.eval()
        with torch.no_grad():
            return model.forward_by_length(tokens)

    curve = []
    for epoch in range(cfg.epochs):
        model.train()
        order = rng.permutation(train)
        losses = []
        for start in range(0, len(order), cfg.batch_size):
            batch = order[start : start + cfg.batch_size]
            ids, inverse = np.unique(np.concatenate([first[batch], second[batch]]), return_inverse=True)
            rewards = model.forward_by_length(tokens[ids])
            r = rewards[torch.from_numpy(inverse)]
            loss = soft_bt_loss(r[: len(batch)], r[len(batch) :], torch.from_numpy(y[batch]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        rewards = all_rewards()
        r_np = rewards.numpy()
        curve.append({
            "epoch": epoch + 1,
            "train_loss": float(np.mean(losses)),
            "val_loss": pair_loss(rewards, first[val], second[val], y[val]),
            "val_agreement": agreement(r_np, first[val], second[val], y[val]),
        })
        ctx.tracker.log_metrics({k: v for k, v in curve[-1].items() if k != "epoch"}, step=epoch + 1)

    raw = all_rewards().numpy().astype(np.float64)
    # Normalisation over the training captions as they occur (frequency-weighted, as the agent will meet them).
    weights = np.bincount(np.concatenate([first[train], second[train]]), minlength=len(captions)).astype(float)
    mean = float(np.average(raw, weights=weights))
    std = float(np.sqrt(np.average((raw - mean) ** 2, weights=weights))) or 1.0
    seen = weights > 0
    quantile_values = np.quantile((raw[seen] - mean) / std, QUANTILE_LEVELS)
    stats = RewardStats(mean, std, QUANTILE_LEVELS, [float(v) for v in quantile_values])

    unseen = ~(seen[first[val]] & seen[second[val]])
    metrics: dict[str, float | int | str] = {
        "train_pairs": len(train),
        "val_pairs": len(val),
        "captions": len(captions),
        "train_loss": curve[-1]["train_loss"],
        "val_loss": curve[-1]["val_loss"],
        "train_agreement": agreement(raw, first[train], second[train], y[train]),
        "val_agreement": agreement(raw, first[val], second[val], y[val]),
        "val_agreement_unseen_captions": agreement(raw, first[val][unseen], second[val][unseen], y[val][unseen]),
        "val_pairs_unseen_captions": int(unseen.sum()),
        "reward_mean": mean,
        "reward_std": std,
        "threshold_q50": stats.threshold(0.5) or 0.0,
    }
    metrics = {k: v for k, v in metrics.items() if not (isinstance(v, float) and np.isnan(v))}
    save_reward_model(model, stats, out, extra={"metrics": metrics})
    normalised = stats.normalize(raw)
    atomic_write_json(out / TABLE, {c: float(v) for c, v in zip(captions, normalised, strict=True)})

    curve_csv.parent.mkdir(parents=True, exist_ok=True)
    with open(curve_csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(curve[0]))
        writer.writeheader()
        writer.writerows(curve)
    mark_finished(out, key)
    return StageResult(metrics=metrics, outputs=[str(out), str(curve_csv)])
