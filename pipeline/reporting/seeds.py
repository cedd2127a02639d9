"""A claim across seeds: the tables of a seed sweep (``curio sweep seeds``, ``curio table --seeds``, the report).

Each seed is one finished run of the DAG with its own training ``seed`` and the same ``eval_seed``, so every seed's
policies played the same held-out episodes. From each run's evaluate-text rows and evaluate-nethack metrics:

- per policy (agent): its success (return) in every seed, the mean over seeds ± the standard error across seeds
  (sample s.d. / √seeds), the s.d. across seeds, and beside it the evaluation's own standard error (the mean over
  seeds of each run's binomial s.e., or the stage's s.e. of the mean return);
- per comparison (SFT − base, DPO − SFT, RL − DPO; NetHack's Motif − extrinsic, intrinsic only − extrinsic and every
  other agent − Motif): the paired difference in every seed (over the same held-out tasks,
  pipeline.reporting.breakdown.paired_difference; NetHack: over the same games) with its evaluation s.e., the mean over
  seeds ± the s.e. across seeds, how many seeds agree with the mean's sign, and the s.d. across seeds beside the mean
  evaluation s.e.;
- for each ONI agent (an online reward, labelled while it trains), its labeller's lag: the share of the distinct
  messages the agent saw that were still queued, unlabelled, when training ended (rl-nethack's ``NAME/oni_pending``
  of ``NAME/oni_labels`` + ``NAME/oni_pending``), per seed, beside its return;
- what the sweep cost: the stages' seconds per seed, and the LLM ledger's requests, sends and tokens summed over
  every stage of every seed.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from pipeline.reporting.breakdown import paired_difference, task_means

#: the text track's policies in pipeline order; each comparison is a policy against the one before it
TEXT_ORDER = ("base", "sft", "dpo", "rl")
#: NetHack's claims against the extrinsic agent: Motif's (the LLM-derived reward helps) and its paper's headline (that
#: reward alone does as well as the game's score); ONI's (and every other agent's) is agent − motif
NETHACK_CLAIMS = (("motif", "extrinsic"), ("intrinsic", "extrinsic"))


@dataclass
class SeedRun:
    """One seed's finished run: its name (the DVC experiment's), seed, every stage's metrics and evaluate-text's
    held-out rows (policy, group, task_id, success)."""

    name: str
    seed: int
    stages: dict[str, dict[str, Any]]
    rows: list[dict] = field(default_factory=list)


@dataclass
class Line:
    """One row of a seed table: a value per seed with its evaluation s.e., and what they say together."""

    label: str
    values: list[float]
    eval_se: list[float]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def sd(self) -> float:
        return statistics.stdev(self.values) if len(self.values) > 1 else math.nan

    @property
    def se(self) -> float:
        return self.sd / math.sqrt(len(self.values)) if len(self.values) > 1 else math.nan

    @property
    def mean_eval_se(self) -> float:
        finite = [s for s in self.eval_se if math.isfinite(s)]
        return statistics.fmean(finite) if finite else math.nan

    def agreeing(self) -> str:
        """How many seeds have the mean's sign, e.g. ``3/3 > 0``."""
        sign = 1 if self.mean > 0 else -1 if self.mean < 0 else 0
        if sign == 0:
            return f"{sum(v == 0 for v in self.values)}/{len(self.values)} = 0"
        agree = sum((v > 0) if sign > 0 else (v < 0) for v in self.values)
        return f"{agree}/{len(self.values)} {'>' if sign > 0 else '<'} 0"


def _binomial_se(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n) if n else math.nan


def text_lines(runs: list[SeedRun]) -> tuple[list[Line], list[Line]]:
    """Held-out success per policy, and each policy − the one before it, paired over the same tasks, per seed."""
    policies = [p for p in TEXT_ORDER if all(any(r["policy"] == p for r in run.rows) for run in runs)]
    per_policy, per_pair = [], []
    for p in policies:
        rates = [[float(bool(r["success"])) for r in run.rows if r["policy"] == p] for run in runs]
        means = [sum(x) / len(x) for x in rates]
        per_policy.append(Line(p, means, [_binomial_se(m, len(x)) for m, x in zip(means, rates, strict=True)]))
    for before, after in zip(policies, policies[1:], strict=False):
        diffs, ses = [], []
        for run in runs:
            tasks = task_means(run.rows)
            d, se, _ = paired_difference(tasks[after], tasks[before])
            diffs.append(d)
            ses.append(se)
        per_pair.append(Line(f"{after} − {before}", diffs, ses))
    return per_policy, per_pair


def nethack_lines(runs: list[SeedRun]) -> tuple[list[Line], list[Line]]:
    """Mean return per agent, and the claims (motif − extrinsic, intrinsic − extrinsic, every other agent − motif),
    paired over the same games: evaluate-nethack's own ``A/return_vs_B`` and its s.e., per seed."""
    stages = [run.stages.get("evaluate-nethack", {}) for run in runs]
    agents = [k.removesuffix("/return") for k in stages[0] if k.endswith("/return")] if stages else []
    agents = [a for a in agents if all(f"{a}/return" in s for s in stages)]
    per_agent = [Line(a, [float(s[f"{a}/return"]) for s in stages],
                      [float(s.get(f"{a}/return_sem", math.nan)) for s in stages]) for a in agents]
    claims = [c for c in NETHACK_CLAIMS if all(a in agents for a in c)]
    claims += [(a, "motif") for a in agents if a not in ("random", "extrinsic", "motif") and "motif" in agents]
    per_claim = []
    for a, b in claims:
        key = f"{a}/return_vs_{b}"
        if all(key in s for s in stages):
            per_claim.append(Line(f"{a} − {b}", [float(s[key]) for s in stages],
                                  [float(s.get(f"{key}_sem", math.nan)) for s in stages]))
    return per_agent, per_claim


@dataclass
class Lag:
    """One ONI agent's labeller at the end of training, per seed: messages still queued, and messages seen."""

    agent: str
    pending: list[int]
    seen: list[int]

    @property
    def shares(self) -> list[float]:
        return [p / s if s else 0.0 for p, s in zip(self.pending, self.seen, strict=True)]


def labeller_lags(runs: list[SeedRun]) -> list[Lag]:
    """Each online agent's queue at the end of training in every seed (rl-nethack's ``NAME/oni_pending`` and
    ``NAME/oni_labels``; seen = labelled + still queued)."""
    stages = [run.stages.get("rl-nethack", {}) for run in runs]
    agents = [k.removesuffix("/oni_pending") for k in stages[0] if k.endswith("/oni_pending")] if stages else []
    lags = []
    for a in agents:
        if all(f"{a}/oni_pending" in s and f"{a}/oni_labels" in s for s in stages):
            pending = [int(s[f"{a}/oni_pending"]) for s in stages]
            lags.append(Lag(a, pending, [p + int(s[f"{a}/oni_labels"]) for p, s in zip(pending, stages, strict=True)]))
    return lags


def lag_cells(lags: list[Lag], seeds: list[int]) -> tuple[list[str], list[list[str]]]:
    """The labellers' table: per agent and seed the share of its messages still queued at the end (queued of
    seen), then the mean share over seeds and the largest."""
    header = ["ONI labeller: messages still queued when training ended", *(f"seed {seed}" for seed in seeds),
              "mean over seeds", "largest"]
    rows = [[lag.agent, *(f"{100 * x:.1f} % ({p} of {s})" for x, p, s in zip(lag.shares, lag.pending, lag.seen,
                                                                           strict=True)),
             f"{100 * statistics.fmean(lag.shares):.1f} %", f"{100 * max(lag.shares):.1f} %"] for lag in lags]
    return header, rows


def cost(runs: list[SeedRun]) -> dict[str, Any]:
    """The stages' seconds per seed and in all, and the LLM ledger summed over every stage of every seed (each
    role's ``PREFIX_requests``, ``PREFIX_sent``, ``PREFIX_tokens_in``, ``PREFIX_tokens_out``)."""
    seconds = {run.name: sum(float(m.get("seconds", 0.0)) for m in run.stages.values()) for run in runs}
    ledger = {"requests": 0, "sent": 0, "tokens_in": 0, "tokens_out": 0}
    for run in runs:
        for metrics in run.stages.values():
            for key in metrics:
                if key.endswith("requests") and not key.endswith("unique_requests"):
                    prefix = key[: -len("requests")]
                    if all(f"{prefix}{c}" in metrics for c in ("tokens_in", "tokens_out")):
                        for column in ledger:
                            ledger[column] += int(metrics.get(prefix + column, 0) or 0)
    return {"seconds": seconds, "total_seconds": sum(seconds.values()), "ledger": ledger}


def _points(x: float, scale: float) -> str:
    return "—" if not math.isfinite(x) else f"{scale * x:.1f}" if scale == 100 else f"{x:.3g}"


def table_cells(title: str, lines: list[Line], seeds: list[int], scale: float, paired: bool
                ) -> tuple[list[str], list[list[str]]]:
    """One table's header and rows: a column per seed (value ± its evaluation s.e.), then mean ± s.e. across seeds,
    the s.d. across seeds beside the mean evaluation s.e., and for a comparison how many seeds agree in sign (the
    text tables and the report's)."""
    header = [title, *(f"seed {seed}" for seed in seeds), "mean ± s.e. over seeds", "s.d. across seeds",
              "mean evaluation s.e.", *(["seeds agreeing"] if paired else [])]
    rows = [[line.label, *(f"{_points(v, scale)} ± {_points(s, scale)}"
                           for v, s in zip(line.values, line.eval_se, strict=True)),
             f"{_points(line.mean, scale)} ± {_points(line.se, scale)}", _points(line.sd, scale),
             _points(line.mean_eval_se, scale), *([line.agreeing()] if paired else [])] for line in lines]
    return header, rows


def table_lines(title: str, lines: list[Line], runs: list[SeedRun], scale: float, paired: bool,
                markdown: bool) -> list[str]:
    """One table (:func:`table_cells`) as text lines, markdown or plain."""
    if not lines:
        return []
    return table_text(*table_cells(title, lines, [run.seed for run in runs], scale, paired), markdown)


def table_text(header: list[str], rows: list[list[str]], markdown: bool = True) -> list[str]:
    """A table's header and rows as text lines, markdown (with its separator line) or plain."""
    return [_row(header, markdown), *(["|" + "---|" * len(header)] if markdown else []),
            *(_row(r, markdown) for r in rows)]


def _row(cells: list[str], markdown: bool) -> str:
    return "| " + " | ".join(cells) + " |" if markdown else "  ".join(cells)


def seed_tables(runs: list[SeedRun], markdown: bool = False) -> list[str]:
    """Every table of a sweep, as lines: text track (points), NetHack (returns), then the cost."""
    text_policy, text_pair = text_lines(runs) if all(run.rows for run in runs) else ([], [])
    agents, claims = nethack_lines(runs)
    out: list[str] = [f"{len(runs)} seeds: {', '.join(f'{run.name} (seed {run.seed})' for run in runs)}"]
    for title, lines, scale, paired in (
            ("held-out success, % (± evaluation s.e.)", text_policy, 100, False),
            ("paired over the same tasks, points", text_pair, 100, True),
            ("NetHack mean return (± evaluation s.e.)", agents, 1, False),
            ("NetHack, paired over the same games", claims, 1, True)):
        if lines:
            out += ["", *table_lines(title, lines, runs, scale, paired, markdown)]
    if lags := labeller_lags(runs):
        out += ["", *table_text(*lag_cells(lags, [run.seed for run in runs]), markdown)]
    spent = cost(runs)
    ledger = spent["ledger"]
    out += ["", "cost: stages' seconds " + ", ".join(f"{name} {s:.0f}" for name, s in spent["seconds"].items())
            + f"; {spent['total_seconds']:.0f} s in all ({spent['total_seconds'] / 60:.1f} min); LLM ledger over "
            f"every stage and seed: {ledger['requests']} requests, {ledger['sent']} sent, {ledger['tokens_in']} "
            f"tokens in, {ledger['tokens_out']} tokens out"]
    return out


def seed_summary(runs: list[SeedRun]) -> dict[str, Any]:
    """The tables as data (``seeds.json``): each line's values, evaluation s.e., mean, s.e., s.d., agreement."""
    def dump(lines: list[Line]) -> list[dict]:
        return [{"label": x.label, "values": x.values, "eval_se": x.eval_se, "mean": x.mean, "se": x.se, "sd": x.sd,
                 "mean_eval_se": x.mean_eval_se, "agreeing": x.agreeing()} for x in lines]

    text_policy, text_pair = text_lines(runs) if all(run.rows for run in runs) else ([], [])
    agents, claims = nethack_lines(runs)
    return {"runs": [{"name": run.name, "seed": run.seed} for run in runs],
            "text": {"policies": dump(text_policy), "comparisons": dump(text_pair)},
            "nethack": {"agents": dump(agents), "comparisons": dump(claims),
                        "labellers": [{"agent": x.agent, "pending": x.pending, "seen": x.seen, "shares": x.shares}
                                      for x in labeller_lags(runs)]},
            "cost": cost(runs)}
