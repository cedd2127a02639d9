"""train-reward-text: Motif's reward model for the text agent (``rl_text.reward: motif``).

Reads ``data/annotate_utterances``; trains the byte-level ``MessageRewardNet`` on the text of each move (the
move, then the messages before it) with the soft-label Bradley-Terry loss (FIRST y = 0, SECOND 1, TIE 0.5;
UNKNOWN left out) on a seeded ``1 − val_fraction`` of the pairs (``pipeline.models.reward_net.fit_reward_model``,
the one train-reward uses); reports agreement with the judge on the others. Saves, as Motif does, μ and σ of the
raw reward over the training moves as they occur and the quantiles of (r − μ)/σ over the distinct ones: rl-text
normalises and thresholds with them (``rl_text.motif``).

Output: ``data/reward_model_text`` (``model.safetensors``, ``config.json``, ``stats.json`` with the metrics and
``context_messages``); learning curve ``metrics/plots/train-reward-text.csv``. With any other ``rl_text.reward``
nothing reads it: ``idle.json`` says so.

    curio stage train-reward-text -S rl_text.reward=motif -S train_reward_text.epochs=20
"""

from __future__ import annotations

import csv
import json

import numpy as np
import torch

from pipeline.core.artifacts import chunk_seed, dataset_hash, read_table
from pipeline.core.checkpoints import finished, mark_finished, run_key
from pipeline.core.stage import IDLE, Out, Plot, Stage, StageContext, StageResult
from pipeline.models.reward_net import STATS, RewardNetConfig, fit_metric_help, fit_reward_model, save_reward_model
from pipeline.params import Params
from pipeline.text.utterance_prefs import Y_OF
from stages.annotate_utterances import idle, write_idle

NAME = "train-reward-text"
METRIC_HELP = {
    "idle": "1 when rl_text.reward is not motif: no reward model to train (the only metric then)",
    "texts": "distinct moves the utterance reward model scored",
    **fit_metric_help("texts"),
}

STAGE = Stage(
    NAME,
    params=["seed", "rl_text.reward", "annotate_utterances.context_messages", "train_reward_text"],
    code=["pipeline/models/reward_net.py"],
    data=["data/annotate_utterances"],
    outs=[Out("data/reward_model_text")],
    plots=[Plot("metrics/plots/train-reward-text.csv", "Utterance reward model, validation agreement", x="epoch",
                y="val_agreement")],
    models=["reward_model_text"],
    model_loader="pipeline.models.reward_net:load_reward_model",
    metric_help=METRIC_HELP,
)


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.train_reward_text
    src, out = params.data_path("annotate_utterances"), params.data_path("reward_model_text")
    curve_csv = params.plots_path(f"{NAME}.csv")
    reason = idle(params)
    if reason is not None:
        curve_csv.parent.mkdir(parents=True, exist_ok=True)
        curve_csv.write_text("epoch,train_loss,val_loss,val_agreement\n")
        result = write_idle(out, reason)
        result.outputs.append(str(curve_csv))
        return result
    if (src / IDLE).exists():
        raise ValueError("train-reward-text: data/annotate_utterances is idle (written for another rl_text.reward): "
                         "run annotate-utterances first")
    key = run_key(params.section_hash(STAGE.params), dataset_hash(src))
    if finished(out, key) and curve_csv.exists():  # seconds long: no checkpoints; a finished model is kept
        return StageResult(metrics=json.loads((out / STATS).read_text())["metrics"], outputs=[str(out), str(curve_csv)])
    (out / IDLE).unlink(missing_ok=True)
    pairs = [r for r in read_table(src, ["pair", "text_first", "text_second", "label"]).to_pylist()
             if r["label"] in Y_OF]
    if not pairs:
        raise ValueError("train-reward-text: every pair in data/annotate_utterances is UNKNOWN: nothing to learn from")
    rng = np.random.default_rng(chunk_seed(params.seed, NAME, 2))
    is_train = rng.random(len(pairs)) >= cfg.val_fraction
    torch.set_num_threads(1)  # a ~40k-parameter network: OpenMP's threads cost more than they give
    try:
        fit = fit_reward_model(
            [p["text_first"] for p in pairs], [p["text_second"] for p in pairs],
            np.array([Y_OF[p["label"]] for p in pairs], dtype=np.float32), is_train,
            RewardNetConfig(cfg.max_len, cfg.embed_dim, cfg.channels, cfg.hidden),
            epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr, weight_decay=cfg.weight_decay,
            seed=chunk_seed(params.seed, NAME, 0), shuffle_seed=chunk_seed(params.seed, NAME, 1),
            log=lambda m, step: ctx.tracker.log_metrics(m, step=step))
    except ValueError as e:
        raise ValueError(f"train-reward-text: {e}") from None
    metrics = {**fit.metrics, "texts": len(fit.texts)}
    save_reward_model(fit.model, fit.stats, out, extra={
        "metrics": metrics, "context_messages": params.annotate_utterances.context_messages})
    curve_csv.parent.mkdir(parents=True, exist_ok=True)
    with open(curve_csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fit.curve[0]))
        writer.writeheader()
        writer.writerows(fit.curve)
    mark_finished(out, key)
    return StageResult(metrics=metrics, outputs=[str(out), str(curve_csv)])
