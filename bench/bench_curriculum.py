"""PAPRIKA's UCB curriculum vs uniform task sampling at equal episode counts, measured side by side.

    python bench/bench_curriculum.py [--groups wordle,mastermind,cellular_automata,minesweeper]
        [--tasks-per-group 16] [--k 4] [--per-round 8] [--alpha 0.5] [--seeds 0 1 2] [--policy scripted:0.5]

Both arms run the real stages (rollout-text → annotate-text → pairs-text) on the same train-task pool with
the same policy, in a temporary data dir: *uniform* plays every pool task once × k (today's rollout-text);
*curriculum* plays ceil(pool / per_round) rounds of ``per_round`` curriculum-picked tasks × k (the same
number of episodes when per_round divides the pool). Printed per arm, averaged over seeds: episodes, distinct
tasks, success rate, mean learning potential of the task plays (CoV of each play's k scores, failures at the
turn limit), share of episodes in a play with both a success and a failure (the plays pairs come from), the
pairs pairs-text makes, and how the episodes spread over difficulty labels.

``--policy``: ``scripted:NOISE`` (default) is the games' scripted player — no weights, and it wins some
tasks in a varying number of turns, which is what the curriculum reacts to; a model path / HF id plays with
the hf backend instead (e.g. ``data/bootstrap/model`` after ``curio stage bootstrap``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from pipeline.core.artifacts import read_rows
from pipeline.core.stage import execute
from pipeline.params import load_params
from pipeline.text.curriculum import learning_potential

REPO = Path(__file__).resolve().parents[1]


def play_stats(rows: list[dict], k: int) -> dict[str, float]:
    """Per task play (one task × k samples of one round): learning potential and mixed outcome."""
    plays: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        plays[(r["group"], r["task_id"], r["seed"], r["sample"] // k)].append(r)
    potentials = [learning_potential([r["score"] for r in p]) for p in plays.values()]
    mixed = sum(len(p) for p in plays.values() if len({bool(r["success"]) for r in p}) == 2)
    return {
        "episodes": len(rows),
        "tasks": len({(r["group"], r["task_id"]) for r in rows}),
        "success_rate": sum(r["success"] for r in rows) / len(rows),
        "mean_potential": statistics.fmean(potentials),
        "mixed_share": mixed / len(rows),
    }


def run_arm(root: Path, name: str, overrides: list[str], k: int) -> dict:
    params = load_params(REPO / "params.yaml", [*overrides, f"data_dir={root / name}"])
    t0 = time.perf_counter()
    execute("rollout-text", params)
    seconds = time.perf_counter() - t0
    execute("annotate-text", params)
    try:
        pairs = execute("pairs-text", params).metrics["pairs"]
    except RuntimeError:  # pairs-text refuses to write an empty set: no task had a chosen and a rejected
        pairs = 0
    rows = read_rows(root / name / "rollout_text")
    stats = play_stats(rows, k)
    spread = Counter(r["difficulty"] for r in rows)
    return {**stats, "pairs": pairs, "rollout_s": seconds,
            **{f"share_{d}": spread[d] / len(rows) for d in ("easy", "medium", "hard")}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", default="wordle,mastermind,cellular_automata,minesweeper")
    ap.add_argument("--tasks-per-group", type=int, default=16, help="train-task pool per group")
    ap.add_argument("--k", type=int, default=4, help="trajectories per task")
    ap.add_argument("--per-round", type=int, default=8, help="curriculum tasks per round")
    ap.add_argument("--alpha", type=float, default=0.5, help="UCB exploration weight")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--policy", default="scripted:0.5", help="scripted:NOISE, or a model path / HF id (hf)")
    args = ap.parse_args()

    groups = [g for g in args.groups.split(",") if g]
    policy = (["policy.backend=scripted", f"policy.model={args.policy}"] if args.policy.startswith("scripted")
              else ["policy.backend=hf", f"policy.model={args.policy}"])
    common = [
        "tracking.enabled=false", f"games.groups=[{','.join(groups)}]", f"games.max_train_tasks={args.tasks_per_group}",
        f"rollout_text.trajectories_per_task={args.k}", f"rollout_text.tasks_per_chunk={args.per_round}", *policy,
    ]
    curriculum = ["rollout_text.curriculum.enabled=true", f"rollout_text.curriculum.tasks_per_round={args.per_round}",
                  f"rollout_text.curriculum.alpha={args.alpha}"]
    results: dict[str, list[dict]] = {"uniform": [], "curriculum": []}
    with tempfile.TemporaryDirectory(prefix="bench-curriculum-") as tmp:
        for seed in args.seeds:
            for arm, extra in (("uniform", []), ("curriculum", curriculum)):
                results[arm].append(run_arm(Path(tmp), f"{arm}-{seed}", [*common, f"seed={seed}", *extra], args.k))

    pool = len(groups) * args.tasks_per_group
    print(f"groups: {', '.join(groups)}  pool: {pool} train tasks  k: {args.k}  per round: {args.per_round}  "
          f"alpha: {args.alpha}  policy: {args.policy}  seeds: {args.seeds}")
    keys = [("episodes", "episodes", "{:.0f}"), ("tasks", "distinct tasks", "{:.1f}"),
            ("success_rate", "success rate", "{:.3f}"), ("mean_potential", "mean learning potential", "{:.3f}"),
            ("mixed_share", "episodes in mixed plays", "{:.3f}"), ("pairs", "pairs (pairs-text)", "{:.1f}"),
            ("share_easy", "share easy", "{:.3f}"), ("share_medium", "share medium", "{:.3f}"),
            ("share_hard", "share hard", "{:.3f}"), ("rollout_s", "rollout seconds", "{:.1f}")]
    print(f"{'':26s} {'uniform':>12s} {'curriculum':>12s} {'ratio c/u':>10s}")
    for key, label, fmt in keys:
        u = statistics.fmean(r[key] for r in results["uniform"])
        c = statistics.fmean(r[key] for r in results["curriculum"])
        ratio = f"{c / u:9.2f}x" if u else f"{'-':>10s}"
        print(f"{label:26s} {fmt.format(u):>12s} {fmt.format(c):>12s} {ratio}")


if __name__ == "__main__":
    main()
