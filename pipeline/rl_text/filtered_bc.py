"""rl-text, ``rl_text.algorithm: filtered_bc``: online filtered behaviour cloning (the ArCHer paper's "Online
Filtered BC" baseline).

The rounds (play, reward, write, keep the val-best round) are pipeline/rl_text/rounds.py's; this file is the
cloning. Each round all trajectories so far are ranked (success first, then fewer turns) and the top
``top_quantile`` fraction is cloned (assistant-only SFT) into the current policy. With a dense ``rl_text.reward``
(judge, motif, oni, infogain) the ranking is by the mean of a trajectory's per-utterance rewards instead (highest
first, ties in play order; stored in the round's rollouts as ``turn_rewards``): the mean, not the sum, because a
judge's reward is mostly positive, so a sum would rank long, failed conversations above short wins. Format-invalid
trajectories are never cloned, with either reward. The model kept is the val-best round, as GRPO's.

On SIGTERM inside a round's cloning it stops with a checkpoint of the step it is on (``pipeline.models.training``),
which the rerun resumes. Output: ``data/rl_text/model`` (+ rounds, rollouts).
"""

from __future__ import annotations

import math

import pyarrow as pa

from pipeline.core.stage import StageContext, StageResult
from pipeline.models.training import sft_train
from pipeline.params import Params
from pipeline.rl_text.rounds import Round, run_rounds
from pipeline.text.play import EPISODE_SCHEMA, summarize

#: What it writes under data/rl_text besides model/ (stages/rl_text.py removes another algorithm's).
OUTPUTS = frozenset({"rollouts", "rounds", "checkpoints"})

JUDGED_SCHEMA = EPISODE_SCHEMA.append(pa.field("turn_rewards", pa.list_(pa.float64())))


def top_fraction(rows: list[dict], fraction: float) -> list[dict]:
    """The best ``fraction`` of trajectories: successes first, then fewer turns (ties keep input order)."""
    valid = [r for r in rows if not r["invalid"]]
    ranked = sorted(valid, key=lambda r: (not r["success"], r["turns"]))
    return ranked[: max(1, math.ceil(fraction * len(valid)))] if valid else []


def top_by_turn_reward(rows: list[dict], fraction: float) -> list[dict]:
    """The best ``fraction`` of trajectories by the mean of their per-utterance rewards (``turn_rewards``),
    highest first (ties keep input order); format-invalid ones are left out."""
    valid = [r for r in rows if not r["invalid"]]
    ranked = sorted(valid, key=lambda r: -mean_reward(r["turn_rewards"]))
    return ranked[: max(1, math.ceil(fraction * len(valid)))] if valid else []


def mean_reward(rewards: list[float]) -> float:
    return sum(rewards) / len(rewards) if rewards else 0.0


class FilteredBC:
    """Filtered BC's step of rl-text's rounds (pipeline/rl_text/rounds.py)."""

    outputs = OUTPUTS
    token_ids = False

    def schema(self, dense: bool) -> pa.Schema:
        return JUDGED_SCHEMA if dense else EPISODE_SCHEMA

    def learn(self, state: Round, model, tokenizer):
        cfg = state.params.rl_text
        so_far = state.rows_so_far()
        keep = top_by_turn_reward(so_far, cfg.top_quantile) if state.rewarded else top_fraction(so_far,
                                                                                               cfg.top_quantile)
        if keep:  # every trajectory so far invalid: nothing to clone, the policy carries over unchanged
            model, _, _ = sft_train(
                model, tokenizer, [k["conversation"] for k in keep], state.scratch, lr=cfg.lr, epochs=cfg.epochs,
                batch_size=cfg.batch_size, seed=state.seed, tracker=state.ctx.tracker,
                prefix=f"rl_round_{state.index}", lora=state.params.train_policy.lora if cfg.lora else None,
            )
        return model, {"rl/success_rate": summarize(state.rows())["success_rate"], "rl/kept": len(keep)}


def run(params: Params, ctx: StageContext) -> StageResult:
    return run_rounds(params, ctx, FilteredBC(), "filtered_bc")
