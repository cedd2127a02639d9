"""rl-text's algorithms × rewards × curriculum at equal environment samples, from one shared DPO policy.

    python bench/compare_rl_text.py --project /tmp/rlcmp -S games.val_fraction=0.2 \
        --rows filtered_bc/outcome,filtered_bc/judge,filtered_bc/motif,filtered_bc/oni,filtered_bc/outcome+curriculum

1. A project dir (params.yaml = the repo's plus ``-S`` overrides; ``games.val_fraction`` must be > 0) runs
   bootstrap → … → train-dpo once; every rl-text run below starts from that DPO policy. When a row uses the
   motif reward, annotate-utterances and train-reward-text run once too (their reward model is shared).
2. Every row (``ALGORITHM/REWARD[+curriculum]``: ``rl_text.algorithm``, ``rl_text.reward``,
   ``rl_text.curriculum.enabled``) × every configuration of its algorithm's small grid (``GRID``; ``--configs N``
   keeps the first N) runs rl-text in its own data dir with the same ``rl_text.rounds × tasks_per_round ×
   trajectories_per_task`` (equal environment samples), and is scored on the validation split (``val``, carved
   from the train tasks): success rate, then fewer turns.
3. Only each row's chosen configuration is then played once on the held-out split (``eval``) of every group in
   ``games.groups``: success ± standard error and mean turns. Writes ``compare.md`` (the table),
   ``compare.json`` and ``rl_compare.json`` (success vs environment samples of the chosen runs' rollouts, a
   dvc-plottable list of rows) into the project dir. The held-out split never informs a choice.

A rerun with the same ``--project`` resumes: a finished policy's scores are kept beside it (``compare_SPLIT.json``,
keyed by the policy's bytes, ``k`` and the temperature), so widening the grid runs only the new configurations.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

UPSTREAM = ["bootstrap", "rollout-text", "annotate-text", "pairs-text", "train-sft", "reflogprobs", "train-dpo"]
MOTIF_UPSTREAM = ["annotate-utterances", "train-reward-text"]
REWARDS = ("outcome", "judge", "motif", "oni")
GRID: dict[str, list[list[str]]] = {
    "filtered_bc": [["rl_text.top_quantile=0.1"], ["rl_text.top_quantile=0.25"]],
    "archer": [["rl_text.archer.actor_lr=0.00001"], ["rl_text.archer.actor_lr=0.0001"]],
    "chai": [["rl_text.chai.num_samples=3"], ["rl_text.chai.num_samples=5"]],
}


def curio(proj: Path, args: list[str]) -> None:
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=proj, env=env, check=True)


def make_project(proj: Path, overrides: list[str]) -> None:
    import yaml

    from pipeline.core.config import _set_dotted, parse_override
    from pipeline.params import load_params

    proj.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    for o in ["tracking.enabled=false", *overrides]:
        _set_dotted(raw, *parse_override(o))
    (proj / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    if load_params(proj / "params.yaml").games.val_fraction <= 0:
        raise SystemExit("set -S games.val_fraction=… (> 0): configurations are chosen on the val split")


def score(rows: list[dict]) -> dict:
    from pipeline.text.play import summarize

    s = summarize(rows)
    p, n = s["success_rate"], s["episodes"]
    return {**s, "se": math.sqrt(p * (1 - p) / n) if n else 0.0}


def policy_hash(data_dir: Path) -> str | None:
    """sha256 over the files of rl-text's final policy in ``data_dir`` (None before it is written)."""
    import hashlib

    model = data_dir / "rl_text" / "model"
    if not model.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(model.rglob("*")):
        if f.is_file():
            h.update(f.relative_to(model).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def scored(data_dir: Path, split: str) -> bool:
    """The policy in ``data_dir`` was scored on ``split`` already (rl-text finished; no need to start it)."""
    cached = data_dir / f"compare_{split}.json"
    return cached.exists() and json.loads(cached.read_text())["key"]["policy"] == policy_hash(data_dir)


def evaluate(proj: Path, data_dir: Path, split: str, k: int, temperature: float) -> dict[str, dict]:
    """Group -> score of the rl policy in ``data_dir`` on ``split`` (plus ``all``); kept in
    ``data_dir/compare_SPLIT.json`` with what it depends on, so a rerun (a larger grid, a killed run) scores each
    finished policy once."""
    from pipeline.params import load_params

    cached = data_dir / f"compare_{split}.json"
    key = {"k": k, "temperature": temperature, "policy": policy_hash(data_dir)}
    if cached.exists() and (old := json.loads(cached.read_text()))["key"] == key:
        return old["scores"]
    from stages.evaluate import evaluate_policy

    params = load_params(proj / "params.yaml", [f"data_dir={data_dir}"])
    rows = evaluate_policy(params, "rl", split, seed=params.seed + 1, k=k, temperature=temperature,
                           groups=params.games.groups)
    out = {g: score([r for r in rows if r["group"] == g]) for g in params.games.groups}
    out["all"] = score(rows)
    tmp = cached.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "scores": out}, indent=1))
    tmp.replace(cached)
    return out


def parse_row(row: str) -> tuple[str, str, bool]:
    """``ALGORITHM/REWARD[+curriculum]`` → (algorithm, reward, curriculum on)."""
    spec, _, extra = row.partition("+")
    alg, _, reward = spec.partition("/")
    reward = reward or "outcome"
    if alg not in GRID or reward not in REWARDS or extra not in ("", "curriculum"):
        raise SystemExit(f"--rows: bad row {row!r} (ALGORITHM/REWARD[+curriculum]; algorithms {', '.join(GRID)}; "
                         f"rewards {', '.join(REWARDS)})")
    return alg, reward, extra == "curriculum"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--project", type=Path, required=True)
    ap.add_argument("-S", dest="overrides", action="append", default=[], help="params override, key=value")
    ap.add_argument("--rows", default="filtered_bc/outcome,archer/outcome,chai/outcome",
                    help="comma-separated ALGORITHM/REWARD[+curriculum]")
    ap.add_argument("--val-k", type=int, default=4, help="samples per val task")
    ap.add_argument("--eval-k", type=int, default=8, help="samples per held-out task")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--configs", type=int, default=None, help="first N configurations of each grid only")
    args = ap.parse_args()
    rows = [parse_row(r) for r in args.rows.split(",")]
    proj = args.project.resolve()
    make_project(proj, args.overrides)
    for stage in UPSTREAM:  # each resumes / is a no-op when already finished
        curio(proj, ["stage", stage])
    if any(reward == "motif" for _, reward, _ in rows):
        for stage in MOTIF_UPSTREAM:
            curio(proj, ["stage", stage, "-S", "rl_text.reward=motif"])
    results = {}
    for alg, reward, curriculum in rows:
        name = f"{alg}/{reward}" + ("+curriculum" if curriculum else "")
        runs = []
        for i, cfg in enumerate(GRID[alg][: args.configs]):
            data = proj / f"data_{alg}_{reward}{'_curriculum' if curriculum else ''}_{i}"
            data.mkdir(parents=True, exist_ok=True)
            for upstream in ("bootstrap", "train_policy", "reward_model_text"):
                if not (data / upstream).exists() and (proj / "data" / upstream).exists():
                    os.symlink(proj / "data" / upstream, data / upstream)
            sets = [f"data_dir={data}", f"metrics_dir={data / 'metrics'}", f"rl_text.algorithm={alg}",
                    f"rl_text.reward={reward}", f"rl_text.curriculum.enabled={str(curriculum).lower()}", *cfg]
            start = time.time()
            if not scored(data, "val"):  # a finished, scored run of an earlier call: not started again
                curio(proj, ["stage", "rl-text", *[x for s in sets for x in ("-S", s)]])
            val = evaluate(proj, data, "val", args.val_k, args.temperature)["all"]
            runs.append({"config": cfg, "data": str(data), "val": val, "rl_seconds": round(time.time() - start)})
            print(f"{name} {cfg}: val success {val['success_rate']:.3f} ± {val['se']:.3f}", flush=True)
        best = max(runs, key=lambda r: (r["val"]["success_rate"], -r["val"]["mean_turns"]))
        best["eval"] = evaluate(proj, Path(best["data"]), "eval", args.eval_k, args.temperature)
        best["history"] = json.loads((Path(best["data"]) / "metrics" / "plots" / "rl_rounds.json").read_text())
        results[name] = {"chosen": best, "grid": runs}
        write(proj, results, args)


def write(proj: Path, results: dict, args) -> None:
    lines = ["| algorithm / reward | chosen on val | val success | env episodes | group | held-out success ± s.e. | "
             "mean turns (wins) | episodes |", "|---|---|---|---|---|---|---|---|"]
    curve = []
    for alg, res in results.items():
        best = res["chosen"]
        samples = best["history"][-1]["episodes"] if best["history"] else 0
        curve += [{**h, "algorithm": alg} for h in best["history"]]
        for group, s in best["eval"].items():
            lines.append(f"| {alg} | {' '.join(best['config'])} | {best['val']['success_rate']:.3f} | {samples} | "
                         f"{group} | {s['success_rate']:.3f} ± {s['se']:.3f} | {s['mean_turns']:.2f} | "
                         f"{s['episodes']} |")
    cmd = " ".join(["python", *sys.argv])
    (proj / "compare.md").write_text(f"`{cmd}`\n\n" + "\n".join(lines) + "\n")
    (proj / "compare.json").write_text(json.dumps(results, indent=1))
    (proj / "rl_compare.json").write_text(json.dumps(curve, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
