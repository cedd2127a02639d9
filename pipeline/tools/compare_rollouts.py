"""Are two rollout datasets draws from the same distribution? (a speed change that keeps what is sampled, not the
draws: e.g. ``policy.drop_finished``; ``curio compare rollouts A B``)

A and B: rollout-text / evaluate-text datasets (``data/rollout_text``) of the same tasks and seeds, played under two
settings. Prints, per group and pooled: success ± binomial s.e. of each and their difference in s.e. of the
difference; mean turns (and on wins); then the policy's replies: tokens per reply (mean, and the two-sample
Kolmogorov-Smirnov test of their distributions). A difference of more than about 2 s.e., or a KS p-value under
0.01, says the two settings do not sample the same thing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from pipeline.core.artifacts import read_rows
from pipeline.tools import ToolError
from pipeline.tools.table import cell  # the held-out table's per-cell figures


def summary(rows: list[dict]) -> dict:
    """The held-out table's cell (success, s.e., turns on wins as ``win_turns``) and mean turns over every
    episode."""
    out = cell(rows)
    return {**out, "win_turns": out["turns"], "turns": sum(r["turns"] for r in rows) / len(rows) if rows else 0.0}


def replies(rows: list[dict]) -> list[str]:
    return [m["content"] for r in rows for m in r["conversation"] if m["role"] == "assistant"]


def episodes(a: Path, b: Path) -> dict[str, list[dict]]:
    """The two datasets' rows, in the same episode order; refused unless they play the same episodes."""
    data = {name: sorted(read_rows(path), key=lambda r: (r["group"], r["task_id"], r["sample"]))
            for name, path in (("A", a), ("B", b))}
    keys = [{(r["group"], r["task_id"], r["sample"]) for r in rows} for rows in data.values()]
    if keys[0] != keys[1]:
        raise ToolError("compare rollouts: the two datasets do not play the same episodes")
    return data


def compare_rollouts(a: Path, b: Path, tokenizer: str) -> None:
    """Print the per-group table and the replies' token counts of the two datasets."""
    from scipy.stats import ks_2samp
    from transformers import AutoTokenizer

    from pipeline.models.gguf import resolve_model

    data = episodes(a, b)
    print(f"A = {a}\nB = {b}\n")
    print(f"{'group':<28} {'A success':>14} {'B success':>14} {'B-A (s.e.)':>11} {'turns A/B':>11} "
          f"{'on wins A/B':>12}")
    groups: dict[str, dict[str, list]] = defaultdict(lambda: {"A": [], "B": []})
    for name, rows in data.items():
        for r in rows:
            groups[r["group"]][name].append(r)
            groups["all"][name].append(r)
    for group in sorted(groups, key=lambda g: (g == "all", g)):
        by = groups[group]
        sa, sb = summary(by["A"]), summary(by["B"])
        diff_se = math.sqrt(sa["se"] ** 2 + sb["se"] ** 2)
        z = (sb["p"] - sa["p"]) / diff_se if diff_se else 0.0
        print(f"{group:<28} {sa['p']:>7.1%} ± {sa['se']:.1%} {sb['p']:>7.1%} ± {sb['se']:.1%} {z:>+11.2f} "
              f"{sa['turns']:>5.2f}/{sb['turns']:<5.2f} {sa['win_turns']:>5.2f}/{sb['win_turns']:<5.2f}")
    tok = AutoTokenizer.from_pretrained(str(resolve_model(tokenizer)))
    lengths = {name: [len(tok.encode(t, add_special_tokens=False)) for t in replies(rows)]
               for name, rows in data.items()}
    ks = ks_2samp(lengths["A"], lengths["B"])
    print(f"\nreplies: A {len(lengths['A'])}, mean {sum(lengths['A']) / len(lengths['A']):.2f} tokens; "
          f"B {len(lengths['B'])}, mean {sum(lengths['B']) / len(lengths['B']):.2f} tokens; "
          f"Kolmogorov-Smirnov D = {ks.statistic:.3f}, p = {ks.pvalue:.3f}")
    same = sum(x == y for x, y in zip(replies(data["A"]), replies(data["B"]), strict=False))
    print(f"replies identical at the same position: {same} of {min(len(lengths['A']), len(lengths['B']))} "
          "(other draws: few should be)")
