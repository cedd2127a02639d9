"""Choose the difficulty tiers a small real model can sometimes win, on the validation split, never on held-out tasks.

    OMP_NUM_THREADS=2 python bench/choose_tiers.py --preset presets/smollm2-learn.yaml [--k 2] [-S key=value]

Every candidate tier (a task group ``GAME@TIER``, pipeline/envs) is played together, batched, by the untrained
base policy of the preset (``policy.model``) on its ``val`` tasks (``games.val_fraction`` of the train tasks,
capped by ``games.max_eval_tasks``), k times each with the evaluation sampling. Prints each tier's val success ±
standard error, mean turns on wins and mean turns; then, per game, the tier picked: the one whose success is
nearest the middle of the learnable band [--low, --high] (both won and lost episodes, so pairs exist), among
those inside it. Nothing is written under data/.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default=None, help="a params preset, e.g. presets/smollm2-learn.yaml")
    ap.add_argument("-S", dest="overrides", action="append", default=[], help="params override, key=value")
    ap.add_argument("--k", type=int, default=2, help="samples per val task")
    ap.add_argument("--candidates", default=" ".join(CANDIDATES), help="space-separated GAME@TIER groups")
    ap.add_argument("--low", type=float, default=0.10, help="lowest val success of a learnable tier")
    ap.add_argument("--high", type=float, default=0.60, help="highest val success of a learnable tier")
    ap.add_argument("--json", type=Path, default=None, help="also write the table here")
    args = ap.parse_args()

    from pipeline.core.config import preset_overrides
    from pipeline.params import load_params
    from stages.evaluate import evaluate_policy

    candidates = args.candidates.split()
    overrides = (preset_overrides(args.preset) if args.preset else []) + args.overrides
    params = load_params(REPO / "params.yaml", [*overrides, f"games.groups={json.dumps(candidates)}",
                                                "games.eval_groups=null"])
    if params.games.val_fraction <= 0:
        raise SystemExit("set games.val_fraction > 0 (preset or -S): the choice is made on the val split")
    t0 = time.perf_counter()
    rows = evaluate_policy(params, "base", "val", seed=params.seed, k=args.k,
                           temperature=params.evaluate_text.temperature, groups=candidates)
    seconds = time.perf_counter() - t0
    results = {c: score([r for r in rows if r["group"] == c]) for c in candidates}
    print(f"base policy {params.policy.model} on val (k={args.k}, {len(rows)} episodes, {seconds:.0f} s)")
    for c, r in results.items():
        print(f"{c:28s} val success {r['success_rate']:.3f} ± {r['se']:.3f}  mean turns on wins "
              f"{r['mean_turns_wins']:.2f}  mean turns {r['mean_turns']:.2f}  ({r['episodes']} episodes)")
    chosen = pick(results, args.low, args.high)
    inside = [t for t in chosen.values() if t]
    print(f"chosen on val (success in [{args.low:.2f}, {args.high:.2f}], nearest its middle): "
          + (", ".join(inside) or "none") + f"  ({len(inside)} groups)")
    if args.json:
        args.json.write_text(json.dumps({"chosen": chosen, "results": results, "seconds": seconds}, indent=1))


if __name__ == "__main__":
    main()
