"""train-reward: the Motif message reward model, Bradley-Terry with soft labels on caption text.

Reads ``data/pairs_nethack``; trains the byte-level ``MessageRewardNet`` on the train split with
``soft_bt_loss`` (ties pull both rewards together, y = 0.5; ``pipeline.models.reward_net.fit_reward_model``,
which train-reward-text shares); reports agreement with the annotator on held-out pairs that have a winner.

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
from pipeline.models.reward_net import STATS, RewardNetConfig, fit_metric_help, fit_reward_model, save_reward_model
from pipeline.nethack.sf import TABLE
from pipeline.params import Params

NAME = "train-reward"
METRIC_HELP = {"captions": "distinct message captions the reward model scored", **fit_metric_help("captions")}

STAGE = Stage(
    NAME,
    params=["seed", "train_reward"],
    code=["pipeline/nethack/reward.py", "pipeline/models/reward_net.py"],
    data=["data/pairs_nethack"],
    outs=[Out("data/reward_model")],
    plots=[Plot("metrics/plots/train-reward.csv", "Reward model, validation agreement", x="epoch", y="val_agreement")],
    models=["reward_model"],
    model_loader="pipeline.nethack.reward:load_reward_model",
    track="nethack",
    metric_help=METRIC_HELP,
)

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
    try:
        fit = fit_reward_model(
            list(pairs["caption_first"]), list(pairs["caption_second"]), pairs["y"].to_numpy(dtype=np.float32),
            (pairs["split"] == "train").to_numpy(),
            RewardNetConfig(cfg.max_len, cfg.embed_dim, cfg.channels, cfg.hidden),
            epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr, weight_decay=cfg.weight_decay,
            seed=chunk_seed(params.seed, NAME, 0), shuffle_seed=chunk_seed(params.seed, NAME, 1),
            log=lambda m, step: ctx.tracker.log_metrics(m, step=step))
    except ValueError as e:
        raise ValueError(f"train-reward: {e}") from None
    model, stats, captions, curve = fit.model, fit.stats, fit.texts, fit.curve
    # NetHack's names: the texts are message captions
    metrics = {k.replace("_texts", "_captions"): v for k, v in fit.metrics.items()}
    metrics = {"train_pairs": metrics.pop("train_pairs"), "val_pairs": metrics.pop("val_pairs"),
               "captions": len(captions), **metrics}
    save_reward_model(model, stats, out, extra={"metrics": metrics})
    atomic_write_json(out / TABLE, {c: float(v) for c, v in zip(captions, fit.normalised, strict=True)})

    curve_csv.parent.mkdir(parents=True, exist_ok=True)
    with open(curve_csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(curve[0]))
        writer.writeheader()
        writer.writerows(curve)
    mark_finished(out, key)
    return StageResult(metrics=metrics, outputs=[str(out), str(curve_csv)])
