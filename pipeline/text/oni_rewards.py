"""``rl_text.reward: oni``: ONI (Zheng, Henaff et al. 2024) for the text agent.

The NetHack track's annotator process (``pipeline.llm.online_annotation``, run with the text labeller and model of
``pipeline.text.oni``) labels the moves rl-text plays while it plays: each round's moves are spooled right after
the round is played; a move's reward is its label (1 helpful / 0 unhelpful) once labelled, else ONI's
classification reward 1[p(helpful) > 0.5] of the reward model that the annotator refits on the labels between
rounds. Round r reads the annotator's snapshot r, the labels and model of the rounds before it
(``rl_text.oni.wait_for_labels``: waits for it; otherwise takes the latest published one).

State: ``data/rl_text/oni/`` (keyed by rl-text's params and its initial policy, so other params never resume it):
the spools, ``labels.jsonl`` and the snapshots; a killed run's rerun starts the annotator on them again (answers
already paid for are in labels.jsonl and the LLM response cache). The process runs at rl-text's priority, like the
NetHack one, gets SIGTERM when rl-text dies (PR_SET_PDEATHSIG) and is stopped by :meth:`OniTurnRewards.close` (the
algorithms call it when they finish) or at exit.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from pipeline.core.artifacts import dir_hash
from pipeline.core.checkpoints import keyed_dir, run_key
from pipeline.core.config import ParamsSlice
from pipeline.core.errors import CurioError
from pipeline.llm import online_annotation
from pipeline.text import oni
from pipeline.text.policies import require_policy

#: The annotator's state, under rl-text's output directory.
DIRECTORY = "oni"


class AnnotatorStalled(CurioError):
    """wait_for_labels: the annotator did not catch up with the rounds played in rl_text.oni.wait_timeout_s."""


def annotator_settings(params: ParamsSlice) -> dict[str, Any]:
    """The annotator process's JSON config, from ``rl_text.oni``."""
    cfg = params.rl_text.oni
    return {"annotator": cfg.annotator.model_dump(mode="json"), "label_threshold": cfg.label_threshold,
            "context_messages": cfg.context_messages, "batch_size": cfg.batch_size,
            "max_attempts": cfg.max_attempts, "model": cfg.model.model_dump(mode="json"), "seed": params.seed}


def oni_directory(params: ParamsSlice, key: str) -> Path:
    """``data/rl_text/oni``, emptied when written under other params (``key``: the hash of rl-text's params) or
    another initial policy."""
    return keyed_dir(params.data_path("rl_text", DIRECTORY), run_key(key, dir_hash(require_policy(params, "dpo"))))


class OniTurnRewards:
    """Spools each round's moves to the annotator process; per move, its label or the refit model's reward."""

    def __init__(self, params: ParamsSlice, key: str, *, poll_s: float = 0.1) -> None:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # each process would spool its part of a round as the round
            raise CurioError("rl_text.reward: oni runs in one process (one annotator, one spool per round); "
                             "run ArCHer / CHAI on one device with it")
        self.cfg = params.rl_text.oni
        self.directory = oni_directory(params, key)
        self.settings = annotator_settings(params)
        self.poll_s = poll_s
        self.proc: Any = None
        self.restarts = 0
        self.stats: dict[str, int] = defaultdict(int)
        self._launch()
        atexit.register(self.close)

    def _launch(self) -> None:
        self.proc = online_annotation.launch(self.directory, oni.FACTORY, self.settings)

    def _alive(self) -> None:
        """A dead annotator is started again (its state is on disk), as the NetHack trainer does."""
        if self.proc is not None and self.proc.poll() is not None:
            self.restarts += 1
            self._launch()

    def snapshot_for(self, round_index: int) -> int | None:
        """The snapshot round ``round_index`` reads: snapshot ``round_index`` (waited for), or the latest one."""
        if not self.cfg.wait_for_labels:
            ready = [k for k in oni.published_rounds(self.directory) if k <= round_index]
            return ready[-1] if ready else None
        deadline = time.monotonic() + self.cfg.wait_timeout_s
        while round_index not in oni.published_rounds(self.directory):
            if time.monotonic() > deadline:
                raise AnnotatorStalled(
                    f"rl_text.oni: the annotator did not label the moves of the rounds before round {round_index} "
                    f"in {self.cfg.wait_timeout_s:g} s (see {self.directory / online_annotation.LOG})")
            self._alive()
            time.sleep(self.poll_s)
        return round_index

    def __call__(self, policy, tokenizer, games, rows, seed, round_index):
        entries = oni.move_entries(rows, self.cfg.context_messages)
        oni.write_spool(self.directory, round_index, [e for mine in entries for e in mine])
        self._alive()
        k = self.snapshot_for(round_index)
        labels, model = oni.read_snapshot(self.directory, k) if k is not None else ({}, None)
        texts = [e["message"] for mine in entries for e in mine]
        flat = oni.move_rewards(texts, labels, model)
        self.stats["moves"] += len(texts)
        self.stats["from_labels"] += sum(t in labels for t in texts)
        self.stats["helpful"] += sum(r > 0 for r in flat)
        out, at = [], 0
        for mine in entries:
            out.append(flat[at:at + len(mine)])
            at += len(mine)
        return out

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {f"rl/oni/{k}": float(v) for k, v in sorted(self.stats.items())}
        out["rl/oni/annotator_restarts"] = float(self.restarts)
        try:
            status = json.loads((self.directory / online_annotation.STATUS).read_text())
        except (OSError, ValueError):
            return out
        for key in ("labels", "helpful_share", "requests", "pending", "given_up", "published_round"):
            if key in status:
                out[f"rl/oni/{key}"] = float(status[key])
        out.update({f"rl/oni/{k}": float(v) for k, v in status.items() if k.startswith("llm_")})
        return out

    def close(self) -> None:
        online_annotation.stop(self.proc)
