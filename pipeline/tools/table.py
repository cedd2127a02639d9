"""The held-out table of a text-track run: success ± standard error and mean turns on wins, per policy and group
(``curio table``).

Reads evaluate-text's episode rows (``DATA/evaluate_text``) and prints, for each policy (base, sft, dpo, rl), the
success pooled over the evaluated groups and per group, each with its binomial standard error, mean turns on
won episodes, and the change from base in points with the standard error of that difference (independent
episodes: sqrt(se_policy² + se_base²)). Under it, each policy's paired difference from the policy before it
(sft − base, dpo − sft, rl − dpo) over the tasks both played: the mean of the per-task differences in mean success
and its standard error (pipeline.reporting.breakdown.paired_difference), tighter than the unpaired one.

``--win-turns`` adds, per policy and group, how many episodes were won at each turn and how many repeated one of
their own earlier replies word for word: where a change in mean turns on wins comes from. On a shown-candidates
tier (``GAME@shownN``) it also prints a lower bound on the mean turns on wins of any policy at the success the
policy reached (``fewest_turns_on_wins``): more wins can force more turns on wins.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from pipeline.core.artifacts import read_rows
from pipeline.envs.base import make_game
from pipeline.envs.gamekit import ShownCandidates
from pipeline.reporting.breakdown import paired_difference, task_means
from pipeline.text.play import pass_at_k


def cell(rows: list[dict]) -> dict:
    n = len(rows)
    wins = [r for r in rows if r["success"]]
    p = len(wins) / n if n else 0.0
    return {"n": n, "p": p, "se": math.sqrt(p * (1 - p) / n) if n else 0.0,
            "turns": sum(r["turns"] for r in wins) / len(wins) if wins else float("nan")}


def fewest_turns_on_wins(success: float, candidates: int, max_turns: int) -> float:
    """A lower bound on the mean turns on wins of any policy at success rate ``success``, on a game whose secret is
    one of ``candidates`` equally likely ones, with one guess or one yes/no question a turn (the shown-candidates
    tiers: a reply tells at most one bit about the secret).

    After t turns a conversation has followed one of at most 2^(t-1) paths that can still end in a win, and each
    wins on one secret, so a policy that knows nothing of the secret beforehand wins by turn t in at most
    min(1, 2^(t-1) / candidates) of its episodes. The fewest turns fill those turns first: 4 candidates, 3 turns,
    success 0.57 -> 0.25 won at turn 1, 0.25 at turn 2, 0.07 at turn 3 -> (0.25 + 0.5 + 0.21) / 0.57 = 1.68.
    With 4 candidates and 3 turns a policy reaches it at any success up to 3/4 (it names a new candidate each turn
    and sometimes wastes the third); above 3/4 the true fewest is higher (2.5 at 1.0, the bound says 2.25).
    """
    reachable = min(1.0, 2 ** (max_turns - 1) / candidates)
    if not 0 < success <= reachable + 1e-12:
        raise ValueError(f"success {success} is outside (0, {reachable:g}] for {candidates} candidates and "
                         f"{max_turns} turns")
    total, left, before = 0.0, success, 0.0
    for turn in range(1, max_turns + 1):
        by_now = min(1.0, 2 ** (turn - 1) / candidates)
        won = min(by_now - before, left)
        total, left, before = total + turn * won, left - won, by_now
    return total / success


def shown_tier(group: str) -> dict | None:
    """The shown-candidates tier of ``group`` (candidates, max_turns), or None for any other game."""
    game = make_game(group)
    return dict(game.tier) if isinstance(game, ShownCandidates) and getattr(game, "tier", None) else None


def repeats(row: dict) -> bool:
    replies = [m["content"].strip().lower() for m in row["conversation"] if m["role"] == "assistant"]
    return len(set(replies)) < len(replies)


def held_out_table(data: Path, markdown: bool = False, win_turns: bool = False) -> list[str]:
    """The table's lines (then, with ``win_turns``, one line per group and policy)."""
    rows = read_rows(data / "evaluate_text")
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    groups = list(dict.fromkeys(r["group"] for r in rows))
    cols = ["all", *groups]
    table = {p: {g: cell([r for r in rows if r["policy"] == p and (g == "all" or r["group"] == g)]) for g in cols}
             for p in policies}
    base = table.get("base")
    sep = " | " if markdown else "  "
    header = ["policy", *(f"{g} success ± s.e. (turns on wins)" for g in cols), "Δ all vs base (± s.e.)",
              "pass@4 (mean@4 = success)"]
    lines = [("| " if markdown else "") + sep.join(header) + (" |" if markdown else "")]
    if markdown:
        lines.append("|" + "---|" * len(header))
    for p in policies:
        cells = [f"{100 * c['p']:.1f} ± {100 * c['se']:.1f} ({c['turns']:.2f}) n={c['n']}" for c in table[p].values()]
        delta = ""
        if base and p != "base":
            a, b = table[p]["all"], base["all"]
            delta = f"{100 * (a['p'] - b['p']):+.1f} ± {100 * math.hypot(a['se'], b['se']):.1f}"
        passed = pass_at_k([r for r in rows if r["policy"] == p], 4)  # None: fewer than 4 episodes of a task
        line = sep.join([p, *cells, delta, f"{100 * passed:.1f}" if passed is not None else "-"])
        lines.append(f"| {line} |" if markdown else line)
    means = task_means(rows)
    if len(policies) > 1:
        lines += ["", "paired over the same tasks, each policy − the one before it (points ± s.e.):"]
    for before, p in zip(policies, policies[1:], strict=False):
        d, se, n = paired_difference(means[p], means[before])
        lines.append(f"{'- ' if markdown else '  '}{p} − {before}: {100 * d:+.1f} ± {100 * se:.1f} ({n} tasks)")
    if win_turns:
        lines += ["", *won_at_each_turn(rows, table, policies, groups)]
    return lines


def won_at_each_turn(rows: list[dict], table: dict, policies: list[str], groups: list[str]) -> list[str]:
    """Per group and policy: episodes won at each turn, replies repeated, and on a shown-candidates tier the bound."""
    lines = []
    for g in groups:
        tier = shown_tier(g)
        for p in policies:
            episodes = [r for r in rows if r["policy"] == p and r["group"] == g]
            won = Counter(r["turns"] for r in episodes if r["success"])
            at = ", ".join(f"turn {t}: {won[t]}" for t in sorted(won))
            fewest = ""
            if tier and won:
                c = table[p][g]
                fewest = (f"; turns on wins at {100 * c['p']:.1f} % are at least "
                          f"{fewest_turns_on_wins(c['p'], tier['candidates'], tier['max_turns']):.2f} "
                          f"(this policy: {c['turns']:.2f})")
            lines.append(f"{g} {p}: {len(episodes)} episodes, won at {at or 'no turn'}; "
                         f"{sum(map(repeats, episodes))} repeat an earlier reply of theirs{fewest}")
    return lines
