"""Choose the difficulty tiers a small real model can sometimes win, on the validation split, never on held-out tasks
(``curio choose tiers``).

Every candidate tier (a task group ``GAME@TIER``, pipeline/envs) is played together, batched, by the untrained
base policy of the preset (``policy.model``) on its ``val`` tasks (``games.val_fraction`` of the train tasks,
capped by ``games.max_eval_tasks``), k times each with the evaluation sampling. Prints each tier's val success ±
standard error, mean turns on wins and mean turns; then, per game, the tier picked: the one whose success is
nearest the middle of the learnable band [--low, --high] (both won and lost episodes, so pairs exist), among
those inside it. Nothing is written under data/.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from pathlib import Path

from pipeline.core.config import preset_overrides
from pipeline.params import load_params
from pipeline.tools import REPO, ToolError, require_val_split

CANDIDATES = ("twenty_questions@shown4", "twenty_questions@shown6", "twenty_questions@shown10",
              "guess_my_city@shown4", "guess_my_city@shown6", "guess_my_city@shown10",
              "bandit@easy2", "bandit@easy3")


def score(rows: list[dict]) -> dict:
    """Success ± standard error (binomial), mean turns on wins, mean turns, episodes."""
    n = len(rows)
    wins = [r for r in rows if r["success"]]
    p = len(wins) / n if n else 0.0
    return {"episodes": n, "success_rate": p, "se": math.sqrt(p * (1 - p) / n) if n else 0.0,
            "mean_turns_wins": sum(r["turns"] for r in wins) / len(wins) if wins else float("nan"),
            "mean_turns": sum(r["turns"] for r in rows) / n if n else float("nan")}


def pick(results: dict[str, dict], low: float, high: float) -> dict[str, str | None]:
    """Per game, the tier inside [low, high] nearest its middle (None when no tier of the game is inside)."""
    by_game: dict[str, list[str]] = defaultdict(list)
    for tier in results:
        by_game[tier.partition("@")[0]].append(tier)
    mid = (low + high) / 2
    chosen = {}
    for game, tiers in by_game.items():
        inside = [t for t in tiers if low <= results[t]["success_rate"] <= high]
        chosen[game] = min(inside, key=lambda t: abs(results[t]["success_rate"] - mid)) if inside else None
    return chosen


def choose_tiers(preset: str | None, overrides: list[str], k: int, candidates: list[str], low: float, high: float,
                 json_out: Path | None = None) -> dict[str, str | None]:
    """Play the candidates on val, print the table and the tiers chosen; the choice, per game."""
    from stages.evaluate_text import evaluate_policy  # the policy backends (torch): only to play

    if not candidates:
        raise ToolError("--candidates: no tier given")
    overrides = (preset_overrides(preset) if preset else []) + overrides
    params = load_params(REPO / "params.yaml", [*overrides, f"games.groups={json.dumps(candidates)}",
                                                "games.eval_groups=null"])
    require_val_split(params)
    t0 = time.perf_counter()
    rows = evaluate_policy(params, "base", "val", seed=params.eval_seed, k=k,
                           temperature=params.evaluate_text.temperature, groups=candidates)
    seconds = time.perf_counter() - t0
    results = {c: score([r for r in rows if r["group"] == c]) for c in candidates}
    print(f"base policy {params.policy.model} on val (k={k}, {len(rows)} episodes, {seconds:.0f} s)")
    for c, r in results.items():
        print(f"{c:28s} val success {r['success_rate']:.3f} ± {r['se']:.3f}  mean turns on wins "
              f"{r['mean_turns_wins']:.2f}  mean turns {r['mean_turns']:.2f}  ({r['episodes']} episodes)")
    chosen = pick(results, low, high)
    inside = [t for t in chosen.values() if t]
    print(f"chosen on val (success in [{low:.2f}, {high:.2f}], nearest its middle): "
          + (", ".join(inside) or "none") + f"  ({len(inside)} groups)")
    if json_out:
        json_out.write_text(json.dumps({"chosen": chosen, "results": results, "seconds": seconds}, indent=1))
    return chosen
