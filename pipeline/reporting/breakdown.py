"""The report's evaluation tables one level deeper, from evaluate-text's rows (one per episode).

- Success by difficulty, category and group, per policy: the mean of ``success`` over held-out episodes, with its
  binomial standard error sqrt(p(1-p)/n).
- Each policy against base on the same tasks (a paired difference). A task t is ``(group, task_id)`` of the
  held-out split; ``p_t`` and ``b_t`` are the policy's and base's mean success over their samples of t. Over the
  T tasks both played, with d_t = p_t - b_t:

      mean  d̄ = (1/T) Σ_t d_t
      SE(d̄)   = sqrt( Σ_t (d_t - d̄)² / (T (T-1)) )      (the sample standard deviation of d over sqrt(T))

  Pairing removes the between-task variance both policies share (a hard task is hard for both), so the SE is
  usually well below that of two independent proportions.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

HELD_OUT = "eval"


def paired_difference(policy: dict[tuple, float], base: dict[tuple, float]) -> tuple[float, float, int]:
    """(d̄, SE(d̄), T) of ``policy[t] - base[t]`` over the tasks in both (SE is nan for T < 2)."""
    common = sorted(set(policy) & set(base))
    d = [policy[t] - base[t] for t in common]
    n = len(d)
    if n == 0:
        return math.nan, math.nan, 0
    mean = sum(d) / n
    if n < 2:
        return mean, math.nan, n
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n * (n - 1)))
    return mean, se, n


def task_means(rows: Iterable[dict]) -> dict[str, dict[tuple, float]]:
    """``{policy: {(group, task_id): mean success over its samples}}``."""
    acc: dict[str, dict[tuple, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        acc[r["policy"]][(r["group"], r["task_id"])].append(float(bool(r["success"])))
    return {p: {t: sum(v) / len(v) for t, v in tasks.items()} for p, tasks in acc.items()}


def success_by(rows: Iterable[dict], column: str) -> tuple[list[str], list[str], dict[tuple[str, str], tuple]]:
    """(values of ``column``, policies, {(value, policy): (mean, binomial SE, n)})."""
    acc: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        acc[(str(r.get(column)), r["policy"])].append(float(bool(r["success"])))
    values = sorted({k[0] for k in acc})
    policies = list(dict.fromkeys(k[1] for k in acc))
    cells = {}
    for k, v in acc.items():
        p = sum(v) / len(v)
        cells[k] = (p, math.sqrt(p * (1 - p) / len(v)), len(v))
    return values, policies, cells


def held_out(rows: Iterable[dict]) -> list[dict]:
    return [r for r in rows if r.get("split") == HELD_OUT]


def paired_rows(rows: list[dict], base: str = "base") -> list[list]:
    """One table row per policy other than ``base``: [policy, d̄, SE, tasks, z = d̄ / SE]."""
    means = task_means(rows)
    if base not in means:
        return []
    out = []
    for policy, tasks in means.items():
        if policy == base:
            continue
        d, se, n = paired_difference(tasks, means[base])
        out.append([policy, d, se, n, d / se if se and se > 0 else math.nan])
    return out
