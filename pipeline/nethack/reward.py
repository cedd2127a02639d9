"""Message reward network (Motif): caption text in, one scalar out; trained with a soft-label Bradley-Terry loss.

The network reads bytes, not tokens: NetHack messages are short, templated and full of names a word vocabulary
would miss ("You kill the jackal!", "You see here 3 gold pieces."). Bytes → embedding → two 1-D convolutions →
masked max-pool over positions → MLP → scalar, as in Motif's char-level encoder. It is small enough (~40k
parameters) to score thousands of messages per millisecond-batch on a CPU, which is what the RL stage needs.

Saved as a directory: ``model.safetensors`` (weights), ``config.json`` (architecture) and ``stats.json``
(normalisation mean/std and quantiles of the normalised reward, written by the train-reward stage).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
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
    max_len: int = 96  # bytes kept per caption; longer ones are cut (NetHack messages are < 80 chars)
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
