"""ONI for the text agent (``rl_text.reward: oni``): the moves' labeller and reward model, run by the shared
annotator process (``pipeline.llm.online_annotation``, the NetHack track's), and the files rl-text reads.

- **What is labelled**: each agent move, as the reward model reads it (``utterance_text``: the move, then the
  ``context_messages`` messages before it, newest first). rl-text spools a round's moves to
  ``seen/round-RRRR.jsonl`` (written whole, atomically) with their context (the episode up to the reply to the
  move); the annotator dedups by text, so a move is labelled once, in the context it was first seen in (ONI's
  exact-string dedup: the label, like the reward model's input, is a function of the text).
- **Labeller** (:class:`TextAnnotator`): rules ``exact`` = helpful iff the move's one-turn reward from the game's
  knowledge base (``exact_move_reward``: mean(split quality, share of the entropy removed) + 1 if it named the
  secret) exceeds ``label_threshold``; any chat backend answers ``prompts/oni_label.yaml`` through Curio's LLM
  layer (response cache, ledger, the backend's retries; an unparseable answer is asked again up to
  ``max_attempts`` times by the shared annotator).
- **Reward model** (:class:`OniRewardModel`): the byte-level ``MessageRewardNet`` with a logistic head, refit from
  scratch (seeded, on the labels sorted by text) each time the annotator has labelled every move of a round:
  the fit depends on the labels only, never on when they came.
- **Snapshots**: the annotator reads the rounds' spools in order and, once round k's moves are all labelled and the
  model refit, publishes ``snapshots/round-{k+1}`` (the labels so far and the model); ``snapshots/round-0000`` is
  empty. Round r's rewards read snapshot r (``wait_for_labels``: waiting for it; otherwise the latest one ≤ r), so
  they depend on the moves of the rounds before r only, and a resumed round gets the same numbers.
- **Reward per move** (:func:`move_rewards`): the label (1 helpful / 0 unhelpful) when labelled, else ONI's
  classification reward 1[p(helpful) > 0.5] = 1[logit > 0]; 0 before any model.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.core.artifacts import atomic_write_bytes, atomic_write_json
from pipeline.envs.base import Game, make_game
from pipeline.llm import make_backend, sampling_from_config
from pipeline.llm.base import Conversation
from pipeline.llm.cache import ask
from pipeline.llm.config import LLMConfig
from pipeline.llm.online_annotation import LABELLED, SEEN, UNKNOWN, OnlineAnnotator
from pipeline.llm.pairwise import raw_text
from pipeline.llm.prompts import load_prompt, render
from pipeline.text.play import PROMPT_MESSAGES, task_from_row
from pipeline.text.utterance_prefs import assistant_indices, exact_move_reward, utterance_text

FACTORY = "pipeline.text.oni:TextAnnotator"
SNAPSHOTS = "snapshots"
SNAPSHOT_LABELS = "labels.json"
SNAPSHOT_MODEL = "model.safetensors"
SNAPSHOT_CONFIG = "config.json"
ROW_KEYS = ("group", "task_id", "secret", "category", "difficulty", "split")

_prompt = functools.partial(load_prompt, Path(__file__).parent / "prompts")
# The tag must close the answer: only trailing whitespace or a full stop may follow it.
_LABEL_RE = re.compile(r"<label>\s*(helpful|unhelpful)\s*</label>[\s.]*\Z", re.IGNORECASE)


def spool_name(round_index: int) -> str:
    return f"round-{round_index:04d}.jsonl"


def snapshot_dir(directory: str | Path, round_index: int) -> Path:
    return Path(directory) / SNAPSHOTS / f"round-{round_index:04d}"


# -- what is labelled -----------------------------------------------------------------------------------------
def move_entries(rows: list[dict], context_messages: int) -> list[list[dict]]:
    """Per played row, one spool entry per agent move: the reward model's text and the labeller's context."""
    out = []
    for row in rows:
        conv = row["conversation"]
        mine = []
        for i in assistant_indices(conv):
            context = {"row": {**{k: row[k] for k in ROW_KEYS if k in row}, "conversation": conv[: i + 2]},
                       "index": i}
            mine.append({"message": utterance_text(conv, i, context_messages), "context": context})
        out.append(mine)
    return out


def write_spool(directory: str | Path, round_index: int, entries: list[dict]) -> bool:
    """Round ``round_index``'s moves, written whole (the annotator never sees half a round). A spool already there
    (a resumed round) is kept: the annotator may have read it. True if written."""
    path = Path(directory) / SEEN / spool_name(round_index)
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, "".join(json.dumps(e) + "\n" for e in entries).encode())
    return True


# -- labeller ---------------------------------------------------------------------------------------------------
def exact_label(game: Game, context: dict, threshold: float) -> tuple[str, str]:
    """helpful iff the move's one-turn reward from the knowledge base exceeds ``threshold``."""
    row = context["row"]
    r = exact_move_reward(game, task_from_row(row), row["conversation"], context["index"])
    return ("helpful" if r > threshold else "unhelpful"), f"R={r:.4f}"


def label_messages(context: dict, context_messages: int) -> Conversation:
    """The ONI-style question "is this one move helpful?" (the game, the secret, the turns before, the move)."""
    p = _prompt("oni_label")
    row, i = context["row"], context["index"]
    conv = row["conversation"]
    turns = [f"{'Agent' if m['role'] == 'assistant' else 'Environment'}: {m['content'].strip()}"
             for m in conv[max(PROMPT_MESSAGES, i - context_messages):i]]
    secret = row["secret"] if isinstance(row["secret"], str) else json.dumps(row["secret"])
    user = render(p["user"], game_text=conv[0]["content"].strip(), secret=secret, category=row.get("category", ""),
                  context="\n".join(turns) if turns else p["no_turns"], move=conv[i]["content"].strip())
    return [{"role": "system", "content": render(p["system"])}, {"role": "user", "content": user}]


def parse_label(text: str) -> str:
    """helpful / unhelpful only from a final ``<label>…</label>`` tag; UNKNOWN otherwise."""
    found = _LABEL_RE.search(text)
    return found.group(1).lower() if found else UNKNOWN


# -- reward model -----------------------------------------------------------------------------------------------
class OniRewardModel:
    """``MessageRewardNet`` as a classifier: logit(p(helpful | text)), fit with BCE on the labels."""

    def __init__(self, net: Any) -> None:
        self.net = net

    @classmethod
    def fit(cls, texts: list[str], y: np.ndarray, cfg: dict, seed: int) -> OniRewardModel:
        import torch
        import torch.nn.functional as F

        from pipeline.models.reward_net import MessageRewardNet, RewardNetConfig, encode_texts

        torch.manual_seed(seed)
        net = MessageRewardNet(RewardNetConfig(max_len=cfg["max_len"], embed_dim=cfg["embed_dim"],
                                               channels=cfg["channels"], hidden=cfg["hidden"]))
        opt = torch.optim.Adam(net.parameters(), lr=cfg["lr"])
        x = encode_texts(texts, cfg["max_len"])
        yt = torch.as_tensor(np.asarray(y, dtype=np.float32))
        rng = np.random.default_rng(seed)
        net.train()
        for _ in range(cfg["steps"]):
            idx = torch.from_numpy(rng.integers(len(texts), size=min(cfg["batch_size"], len(texts))))
            loss = F.binary_cross_entropy_with_logits(net(x[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        return cls(net)

    def logits(self, texts: list[str]) -> np.ndarray:
        import torch

        from pipeline.models.reward_net import encode_texts

        if not texts:
            return np.zeros(0)
        with torch.no_grad():
            return self.net(encode_texts(texts, self.net.config.max_len)).numpy().astype(np.float64)

    def save(self, directory: Path) -> None:
        from dataclasses import asdict

        from safetensors.torch import save_file

        save_file(self.net.state_dict(), str(directory / SNAPSHOT_MODEL))
        (directory / SNAPSHOT_CONFIG).write_text(json.dumps(asdict(self.net.config)))

    @classmethod
    def load(cls, directory: Path) -> OniRewardModel | None:
        if not (directory / SNAPSHOT_MODEL).exists():
            return None
        from safetensors.torch import load_file

        from pipeline.models.reward_net import MessageRewardNet, RewardNetConfig

        net = MessageRewardNet(RewardNetConfig(**json.loads((directory / SNAPSHOT_CONFIG).read_text())))
        net.load_state_dict(load_file(str(directory / SNAPSHOT_MODEL)))
        net.eval()
        return cls(net)


def classification_rewards(logits: np.ndarray) -> np.ndarray:
    """ONI's classification reward 1[p(helpful) > 0.5] = 1[logit > 0]."""
    return (np.asarray(logits, dtype=np.float64) > 0.0).astype(np.float64)


def move_rewards(texts: list[str], labels: dict[str, float], model: OniRewardModel | None) -> list[float]:
    """Per move: its label (1 / 0) when labelled, else the model's classification reward (0 without a model)."""
    unknown = [t for t in texts if t not in labels]
    predicted = dict(zip(unknown, classification_rewards(model.logits(unknown)).tolist(), strict=True)) \
        if model is not None and unknown else {}
    return [float(labels[t]) if t in labels else float(predicted.get(t, 0.0)) for t in texts]


def read_snapshot(directory: str | Path, round_index: int) -> tuple[dict[str, float], OniRewardModel | None]:
    path = snapshot_dir(directory, round_index)
    labels = json.loads((path / SNAPSHOT_LABELS).read_text())
    return {m: float(v) for m, v in labels.items()}, OniRewardModel.load(path)


SNAPSHOT_NAME = re.compile(r"round-(\d+)")  # a published snapshot; round-RRRR.tmp is one being written


def published_rounds(directory: str | Path) -> list[int]:
    """The rounds whose snapshot is published, in order (a snapshot still being written is not one of them)."""
    root = Path(directory) / SNAPSHOTS
    if not root.exists():
        return []
    names = (SNAPSHOT_NAME.fullmatch(p.name) for p in root.iterdir() if (p / SNAPSHOT_LABELS).exists())
    return sorted(int(m.group(1)) for m in names if m)


# -- the annotator ------------------------------------------------------------------------------------------------
DEFAULTS: dict[str, Any] = {
    "annotator": {"backend": "rules", "model": "exact"},
    "label_threshold": 0.25,
    "context_messages": 4,
    "model": {"steps": 200, "batch_size": 64, "lr": 3e-3, "max_len": 256, "embed_dim": 16, "channels": 32,
              "hidden": 64},
    "batch_size": 32,
    "max_attempts": 3,
    "seed": 0,
    "poll_s": 0.2,
}


class TextAnnotator(OnlineAnnotator):
    """The shared annotator with the text agent's labeller (rules ``exact`` or the ONI-style prompt) and reward
    model, reading the rounds' spools in order and publishing a snapshot per round caught up with."""

    defaults = DEFAULTS

    def setup(self) -> None:
        self.rules = self.cfg["annotator"]["backend"] == "rules"
        self.games: dict[str, Game] = {}
        self.round = 0  # the round whose spool is being labelled; snapshots 0..round are published
        self.model: OniRewardModel | None = None
        self.fits = 0

    def load_model(self) -> None:
        rounds = published_rounds(self.directory)
        if rounds:
            self.round = rounds[-1]
            self.model = OniRewardModel.load(snapshot_dir(self.directory, self.round))
        else:
            self._snapshot(0)

    @property
    def backend(self) -> Any:
        if self._backend is None and not self.rules:
            self._backend = make_backend(LLMConfig(**self.cfg["annotator"]), role="oni_annotator")
        return self._backend

    def spool_files(self) -> list[Path]:
        return [p for r in range(self.round + 1) if (p := self.directory / SEEN / spool_name(r)).exists()]

    def label(self, batch: list[str]) -> list[tuple[str, str]]:
        if self.rules:
            out = []
            for m in batch:
                context = self.context[m]
                group = context["row"]["group"]
                if group not in self.games:
                    self.games[group] = make_game(group)
                out.append(exact_label(self.games[group], context, self.cfg["label_threshold"]))
            return out
        cfg = LLMConfig(**self.cfg["annotator"])
        conversations = [label_messages(self.context[m], self.cfg["context_messages"]) for m in batch]
        answers = ask(self.backend, conversations, sampling_from_config(cfg), lambda t: parse_label(t) != UNKNOWN)
        labels = [(parse_label(g.text) if g.error is None else UNKNOWN, raw_text(g)) for g in answers]
        ledger = getattr(self.backend, "ledger", None)
        if ledger is not None:
            ledger.count_unknown(sum(label == UNKNOWN for label, _ in labels))
        return labels

    def step(self) -> bool:
        busy = super().step()
        # a spool is written whole: once polled, the round's moves are all in (an offset is kept per file polled)
        if self.directory / SEEN / spool_name(self.round) in self._offsets and not self.pending():
            self.refit()
            self.round += 1
            self._snapshot(self.round)
            self.publish()
            self.write_status()
            return True
        return busy

    def refit(self) -> None:
        """The model from scratch on every final label so far, sorted by text: a function of the labels only."""
        known = sorted((m, float(label == "helpful")) for m, label in self.labels.items() if label in LABELLED)
        if known:
            self.model = OniRewardModel.fit([m for m, _ in known], np.array([y for _, y in known]),
                                            self.cfg["model"], self.cfg["seed"])
            self.fits += 1

    def _snapshot(self, round_index: int) -> None:
        labels = {m: float(label == "helpful") for m, label in self.labels.items() if label in LABELLED}
        final = snapshot_dir(self.directory, round_index)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if self.model is not None:
            self.model.save(tmp)
        atomic_write_json(tmp / SNAPSHOT_LABELS, labels)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)

    def rewards(self) -> dict[str, float]:
        seen = list(self.seen)
        labels = {m: float(label == "helpful") for m, label in self.labels.items() if label in LABELLED}
        return dict(zip(seen, move_rewards(seen, labels, self.model), strict=True))

    def status(self) -> dict[str, float | int]:
        out = super().status()
        out["published_round"] = self.round
        out["fits"] = self.fits
        out["requests"] = sum(self.attempts.values())  # label answers received (rules: computed), every run
        return out
