"""Text reward network (Motif): a text in, one scalar out; trained with a soft-label Bradley-Terry loss.

The network reads bytes, not tokens: the texts it scores are short and full of names a word vocabulary would
miss (NetHack's messages, "You kill the jackal!"; a text agent's utterance with the reply before it). Bytes →
embedding → two 1-D convolutions → masked max-pool over positions → MLP → scalar, as in Motif's char-level
encoder. It is small enough (~40k parameters) to score thousands of texts per millisecond-batch on a CPU, which
is what the RL stages need. Both tracks train it with :func:`fit_reward_model` (train-reward on NetHack captions,
train-reward-text on utterances).

Saved as a directory: ``model.safetensors`` (weights), ``config.json`` (architecture) and ``stats.json``
(normalisation mean/std and quantiles of the normalised reward, written by the training stage).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from pipeline.core.artifacts import atomic_write_json, verify_model, write_model_manifest

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
STATS = "stats.json"


@dataclass(frozen=True)
class RewardNetConfig:
    max_len: int = 96  # bytes kept per text; longer ones are cut (NetHack messages are < 80 chars)
    embed_dim: int = 16
    channels: int = 32
    hidden: int = 64


def encode_texts(texts: Sequence[str], max_len: int) -> torch.Tensor:
    """Byte ids (1..256, 0 = padding) of each text, cut or padded to ``max_len``: [len(texts), max_len]."""
    out = np.zeros((len(texts), max_len), dtype=np.int64)
    for row, text in enumerate(texts):
        data = np.frombuffer(text.encode("utf-8")[:max_len], dtype=np.uint8)
        out[row, : len(data)] = data.astype(np.int64) + 1
    return torch.from_numpy(out)


class MessageRewardNet(nn.Module):
    def __init__(self, config: RewardNetConfig | None = None) -> None:
        super().__init__()
        self.config = config or RewardNetConfig()
        c = self.config
        self.embed = nn.Embedding(257, c.embed_dim, padding_idx=0)
        self.conv1 = nn.Conv1d(c.embed_dim, c.channels, kernel_size=3, padding=1)
        # Dilation widens the view to ~word-sized spans without a third layer.
        self.conv2 = nn.Conv1d(c.channels, c.channels, kernel_size=3, padding=2, dilation=2)
        self.head = nn.Sequential(nn.Linear(c.channels, c.hidden), nn.ReLU(), nn.Linear(c.hidden, 1))

    def forward(self, byte_ids: torch.Tensor) -> torch.Tensor:
        """Rewards [B] of byte-id rows [B, L]."""
        # Drop padding columns no text reaches (most captions are far shorter than max_len). Keeping 3 past
        # the longest text covers the convolutions' reach, so a text's reward never depends on its batch.
        used = int((byte_ids > 0).sum(dim=1).max()) if byte_ids.numel() else 0
        byte_ids = byte_ids[:, : max(1, min(used + 3, byte_ids.shape[1]))]
        mask = (byte_ids > 0).unsqueeze(1)  # [B, 1, L]
        x = self.embed(byte_ids).transpose(1, 2)  # [B, E, L]
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        # Max over real positions only; an empty caption (all padding) pools to zeros.
        x = x.masked_fill(~mask, float("-inf")).amax(dim=2)
        x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
        return self.head(x).squeeze(-1)

    def forward_by_length(self, byte_ids: torch.Tensor, bucket: int = 128) -> torch.Tensor:
        """``forward`` on rows sorted by length in buckets, so short texts are not padded to the longest one
        (a few long messages would otherwise set the cost of every row)."""
        lengths = (byte_ids > 0).sum(dim=1)
        order = torch.argsort(lengths, stable=True)  # stable: same buckets, same floats, every run
        parts = [self(byte_ids[order[i : i + bucket]]) for i in range(0, len(order), bucket)]
        out = torch.cat(parts) if parts else byte_ids.new_zeros(0, dtype=torch.float32)
        return out[torch.argsort(order)]

    @torch.no_grad()
    def score(self, texts: Sequence[str]) -> np.ndarray:
        """Raw rewards of ``texts`` as float64."""
        self.eval()
        if not texts:
            return np.zeros(0)
        return self.forward_by_length(encode_texts(texts, self.config.max_len)).double().numpy()


def soft_bt_loss(reward_first: torch.Tensor, reward_second: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Bradley-Terry cross-entropy with soft labels.

    p = softmax(r1, r2); the target is (1 − y, y) with y = 0 (first preferred), 1 (second) or 0.5 (tie):
    loss = −[(1 − y)·log σ(r1 − r2) + y·log σ(r2 − r1)], averaged over pairs.
    """
    diff = reward_first - reward_second
    return -((1 - y) * F.logsigmoid(diff) + y * F.logsigmoid(-diff)).mean()


@dataclass
class RewardStats:
    """Normalisation of the raw reward and the quantiles of the normalised reward over unique messages."""

    mean: float
    std: float
    quantile_levels: list[float]
    quantile_values: list[float]

    def normalize(self, raw: np.ndarray | float) -> np.ndarray | float:
        return (raw - self.mean) / self.std

    def threshold(self, quantile: float | None) -> float | None:
        """ε for a quantile level in [0, 1] (interpolated between the saved levels); None turns it off.

        Motif looked the level up among its saved ones by exact float equality, so any other level crashed;
        interpolation makes every level in [0, 1] valid.
        """
        if quantile is None:
            return None
        if not 0.0 <= quantile <= 1.0:
            raise ValueError(f"threshold quantile {quantile} is outside [0, 1]")
        return float(np.interp(quantile, self.quantile_levels, self.quantile_values))


def save_reward_model(
    model: MessageRewardNet, stats: RewardStats, directory: str | Path, extra: dict | None = None
) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / WEIGHTS))
    atomic_write_json(directory / CONFIG, asdict(model.config))
    atomic_write_json(directory / STATS, {**asdict(stats), **(extra or {})})
    write_model_manifest(directory, [WEIGHTS, CONFIG, STATS])


def load_reward_model(directory: str | Path) -> tuple[MessageRewardNet, RewardStats]:
    directory = Path(directory)
    verify_model(directory)
    model = MessageRewardNet(RewardNetConfig(**json.loads((directory / CONFIG).read_text())))
    model.load_state_dict(load_file(str(directory / WEIGHTS)))
    model.eval()
    raw = json.loads((directory / STATS).read_text())
    stats = RewardStats(**{k: raw[k] for k in ("mean", "std", "quantile_levels", "quantile_values")})
    return model, stats


# -- fitting: the same for every track ------------------------------------------------------------------------
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


@dataclass
class FittedRewardModel:
    model: MessageRewardNet
    stats: RewardStats
    texts: list[str]
    """Every distinct text of the pairs, in first-seen order."""
    normalised: np.ndarray
    """(r − μ)/σ of each of ``texts``."""
    curve: list[dict]
    """One row per epoch: train_loss, val_loss, val_agreement."""
    metrics: dict[str, float | int]


def fit_metric_help(texts: str) -> dict[str, str]:
    """What each metric of :func:`fit_reward_model` means, as a stage declares it (``texts``: what its texts are:
    NetHack's captions, the text track's moves)."""
    return {
        "train_pairs": "preference pairs trained on",
        "val_pairs": "held-out preference pairs",
        "train_loss": "Bradley-Terry loss on the train pairs, last epoch",
        "val_loss": "Bradley-Terry loss on the val pairs, last epoch",
        "train_agreement": "share of the train pairs whose preferred side the model scores higher",
        "val_agreement": "share of the val pairs whose preferred side the model scores higher",
        f"val_agreement_unseen_{texts}": f"val agreement over the val pairs with one of their {texts} in no train pair",
        f"val_pairs_unseen_{texts}": f"val pairs with one of their {texts} in no train pair",
        "reward_mean": "mean raw reward over the texts trained on (the normalisation's shift)",
        "reward_std": "standard deviation of the raw reward over them (the normalisation's scale)",
        "threshold_q50": "the median normalised reward (the threshold at quantile 0.5)",
    }


def fit_reward_model(first_texts: Sequence[str], second_texts: Sequence[str], y: np.ndarray, is_train: np.ndarray,
                     config: RewardNetConfig, *, epochs: int, batch_size: int, lr: float, weight_decay: float,
                     seed: int, shuffle_seed: int, log: Callable[[dict, int], None] | None = None
                     ) -> FittedRewardModel:
    """Bradley-Terry with soft labels on text pairs (y = 0: first preferred, 1: second, 0.5: tie), Adam.

    ``seed`` seeds torch (the initial weights), ``shuffle_seed`` the order of the pairs in each epoch.
    Trains on the pairs with ``is_train``, reports agreement with the annotator on the others. Each step scores
    only the distinct texts of its batch (texts repeat heavily). Then μ and σ of the raw reward over the
    training texts as they occur (frequency-weighted, as the agent will meet them) and the quantiles 0.00…1.00
    of (r − μ)/σ over the distinct training texts (Motif's normalisation and threshold levels).
    """
    torch.manual_seed(seed)
    rng = np.random.default_rng(shuffle_seed)
    texts = list(dict.fromkeys([*first_texts, *second_texts]))  # every text once; pairs become index pairs
    index = {c: i for i, c in enumerate(texts)}
    first = np.array([index[t] for t in first_texts], dtype=np.int64)
    second = np.array([index[t] for t in second_texts], dtype=np.int64)
    y = np.asarray(y, dtype=np.float32)
    is_train = np.asarray(is_train, dtype=bool)
    train, val = np.flatnonzero(is_train), np.flatnonzero(~is_train)
    if len(train) == 0:
        raise ValueError("no training pairs (did the annotator label everything UNKNOWN?)")
    model = MessageRewardNet(config)
    tokens = encode_texts(texts, config.max_len)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)

    def all_rewards() -> torch.Tensor:
        model.eval()
        with torch.no_grad():
            return model.forward_by_length(tokens)

    curve = []
    for epoch in range(epochs):
        model.train()
        order = rng.permutation(train)
        losses = []
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            ids, inverse = np.unique(np.concatenate([first[batch], second[batch]]), return_inverse=True)
            r = model.forward_by_length(tokens[ids])[torch.from_numpy(inverse)]
            loss = soft_bt_loss(r[: len(batch)], r[len(batch) :], torch.from_numpy(y[batch]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        rewards = all_rewards()
        curve.append({
            "epoch": epoch + 1,
            "train_loss": float(np.mean(losses)),
            "val_loss": pair_loss(rewards, first[val], second[val], y[val]),
            "val_agreement": agreement(rewards.numpy(), first[val], second[val], y[val]),
        })
        if log is not None:
            log({k: v for k, v in curve[-1].items() if k != "epoch"}, epoch + 1)

    raw = all_rewards().numpy().astype(np.float64)
    weights = np.bincount(np.concatenate([first[train], second[train]]), minlength=len(texts)).astype(float)
    mean = float(np.average(raw, weights=weights))
    std = float(np.sqrt(np.average((raw - mean) ** 2, weights=weights))) or 1.0
    seen = weights > 0
    quantile_values = np.quantile((raw[seen] - mean) / std, QUANTILE_LEVELS)
    stats = RewardStats(mean, std, QUANTILE_LEVELS, [float(v) for v in quantile_values])
    unseen = ~(seen[first[val]] & seen[second[val]])
    metrics: dict[str, float | int] = {
        "train_pairs": len(train),
        "val_pairs": len(val),
        "train_loss": curve[-1]["train_loss"],
        "val_loss": curve[-1]["val_loss"],
        "train_agreement": agreement(raw, first[train], second[train], y[train]),
        "val_agreement": agreement(raw, first[val], second[val], y[val]),
        "val_agreement_unseen_texts": agreement(raw, first[val][unseen], second[val][unseen], y[val][unseen]),
        "val_pairs_unseen_texts": int(unseen.sum()),
        "reward_mean": mean,
        "reward_std": std,
        "threshold_q50": stats.threshold(0.5) or 0.0,
    }
    metrics = {k: v for k, v in metrics.items() if not (isinstance(v, float) and np.isnan(v))}
    return FittedRewardModel(model, stats, texts, np.asarray(stats.normalize(raw)), curve, metrics)
