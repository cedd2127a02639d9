"""The held-out table of a text-track run: success ± standard error and mean turns on wins, per policy and group.

    python bench/learn_table.py [--data data] [--markdown] [--win-turns]

Reads evaluate-text's episode rows (``DATA/evaluate_text``) and prints, for each policy (base, sft, dpo, rl), the
success pooled over the evaluated groups and per group, each with its binomial standard error, mean turns on
won episodes, and the change from base in points with the standard error of that difference (independent
episodes: sqrt(se_policy² + se_base²)).

``--win-turns`` adds, per policy and group, how many episodes were won at each turn and how many repeated one of
their own earlier replies word for word: where a change in mean turns on wins comes from.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def cell(rows: list[dict]) -> dict:
    n = len(rows)
    wins = [r for r in rows if r["success"]]
    p = len(wins) / n if n else 0.0
    return {"n": n, "p": p, "se": math.sqrt(p * (1 - p) / n) if n else 0.0,
            "turns": sum(r["turns"] for r in wins) / len(wins) if wins else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=REPO / "data")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table")
    ap.add_argument("--win-turns", action="store_true", help="also episodes won at each turn, and repeated replies")
    args = ap.parse_args()
    from pipeline.core.artifacts import read_rows

    rows = read_rows(args.data / "evaluate_text")
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    groups = list(dict.fromkeys(r["group"] for r in rows))
    cols = ["all", *groups]
    table = {p: {g: cell([r for r in rows if r["policy"] == p and (g == "all" or r["group"] == g)]) for g in cols}
             for p in policies}
    base = table.get("base")
    sep = " | " if args.markdown else "  "
    header = ["policy", *(f"{g} success ± s.e. (turns on wins)" for g in cols), "Δ all vs base (± s.e.)"]
    print(("| " if args.markdown else "") + sep.join(header) + (" |" if args.markdown else ""))
    if args.markdown:
        print("|" + "---|" * len(header))
    for p in policies:
        cells = [f"{100 * c['p']:.1f} ± {100 * c['se']:.1f} ({c['turns']:.2f}) n={c['n']}" for c in table[p].values()]
        delta = ""
        if base and p != "base":
            a, b = table[p]["all"], base["all"]
            delta = f"{100 * (a['p'] - b['p']):+.1f} ± {100 * math.hypot(a['se'], b['se']):.1f}"
        line = sep.join([p, *cells, delta])
        print(f"| {line} |" if args.markdown else line)
    if args.win_turns:
        print()
        for g in groups:
            for p in policies:
                episodes = [r for r in rows if r["policy"] == p and r["group"] == g]
                won = Counter(r["turns"] for r in episodes if r["success"])
                at = ", ".join(f"turn {t}: {won[t]}" for t in sorted(won))
                print(f"{g} {p}: {len(episodes)} episodes, won at {at or 'no turn'}; "
                      f"{sum(map(repeats, episodes))} repeat an earlier reply of theirs")


def repeats(row: dict) -> bool:
    replies = [m["content"].strip().lower() for m in row["conversation"] if m["role"] == "assistant"]
    return len(set(replies)) < len(replies)


if __name__ == "__main__":
    main()
