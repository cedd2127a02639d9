"""rl-text's algorithms × rewards × curriculum at equal environment samples, from one shared DPO policy
(``curio compare rl-text``).

    curio compare rl-text --project /tmp/rlcmp -S games.val_fraction=0.2 \
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
   ``games.groups``: success ± standard error (= mean@k), pass@k and mean turns on wins. The shared DPO policy is
   scored on val and held-out the same way (the same tasks, k, temperature and seed), so each row also gets its
   paired difference from DPO over the same tasks, d̄ ± SE(d̄) (pipeline.reporting.breakdown.paired_difference). The row
   with the best val success is the comparison's choice (``chosen_row``). Writes ``compare.md`` (the table),
   ``compare.json`` and ``rl_compare.json`` (success vs environment samples of the chosen runs' rollouts, a
   dvc-plottable list of rows) into the project dir. The held-out split never informs a choice.

A rerun with the same ``--project`` resumes: a finished policy's scores are kept beside it (``compare_SPLIT.json``,
keyed by the policy's bytes, ``k`` and the temperature), so widening the grid runs only the new configurations.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from pipeline.core.config import _set_dotted, parse_override
from pipeline.params import load_params
from pipeline.reporting.breakdown import paired_difference, task_means
from pipeline.text.play import pass_at_k, summarize
from pipeline.tools import REPO, ToolError

UPSTREAM = ["bootstrap", "rollout-text", "annotate-text", "pairs-text", "train-sft", "reflogprobs", "train-dpo"]
MOTIF_UPSTREAM = ["annotate-utterances", "train-reward-text"]
REWARDS = ("outcome", "judge", "motif", "oni", "infogain")
GRID: dict[str, list[list[str]]] = {
    "filtered_bc": [["rl_text.top_quantile=0.1"], ["rl_text.top_quantile=0.25"]],
    "archer": [["rl_text.archer.actor_lr=0.00001"], ["rl_text.archer.actor_lr=0.0001"]],
    "chai": [["rl_text.chai.num_samples=3"], ["rl_text.chai.num_samples=5"]],
    # the first point is the one --configs 1 runs: LoRA's usual rate (the real-model preset trains adapters)
    "grpo": [["rl_text.grpo.lr=0.0001"], ["rl_text.grpo.lr=0.00001"]],
    "grpo_turn": [["rl_text.grpo.credit=turn", "rl_text.grpo.lr=0.0001"],
                  ["rl_text.grpo.credit=turn", "rl_text.grpo.lr=0.00001"]],
}
ALGORITHM = {"grpo_turn": "grpo"}  # a row name that is an algorithm with a setting of its own: GRPO's turn credit


def curio(proj: Path, args: list[str]) -> None:
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(REPO)}
    rc = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=proj, env=env).returncode
    if rc:
        raise ToolError(f"`curio {' '.join(args)}` in {proj} failed (exit {rc}; its message is above)")


def make_project(proj: Path, overrides: list[str]) -> None:
    proj.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    for o in ["tracking.enabled=false", *overrides]:
        _set_dotted(raw, *parse_override(o))
    (proj / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    if load_params(proj / "params.yaml").games.val_fraction <= 0:
        raise ToolError("set -S games.val_fraction=… (> 0): configurations are chosen on the val split")


SCORES_VERSION = 2  # bumped when a cached score gains fields: an older cache is scored again


def score(rows: list[dict], k: int) -> dict:
    """Success ± binomial s.e. (= mean@k with k samples a task), pass@k (None below k samples a task), mean turns
    on wins, and each task's mean success (``GROUP/TASK_ID`` -> mean), for paired differences. ``rows``: one
    policy's episodes."""
    s = summarize(rows)
    p, n = s["success_rate"], s["episodes"]
    tasks = {f"{g}/{t}": m for means in task_means(rows).values() for (g, t), m in means.items()}
    return {**s, "se": math.sqrt(p * (1 - p) / n) if n else 0.0, "pass_at_k": pass_at_k(rows, k), "k": k,
            "tasks": tasks}


def paired(policy: dict, reference: dict) -> dict:
    """The paired difference ``policy − reference`` in success over the tasks both played: d̄, SE(d̄), T."""
    d, se, n = paired_difference(policy["tasks"], reference["tasks"])
    return {"diff": d, "se": se, "tasks": n}


POLICY_DIRS = {"rl": ("rl_text", "model"), "dpo": ("train_policy", "dpo")}


def policy_hash(data_dir: Path, policy: str = "rl") -> str | None:
    """sha256 over the files of the named policy in ``data_dir`` (rl-text's final policy, or the DPO policy every
    row starts from; None before it is written)."""
    model = data_dir.joinpath(*POLICY_DIRS[policy])
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


def evaluate(proj: Path, data_dir: Path, split: str, k: int, temperature: float, policy: str = "rl"
             ) -> dict[str, dict]:
    """Group -> score of the named policy in ``data_dir`` on ``split`` (plus ``all``); kept in
    ``data_dir/compare_SPLIT.json`` (``compare_dpo_SPLIT.json`` for DPO) with what it depends on, so a rerun (a
    larger grid, a killed run) scores each finished policy once. Every policy plays the same tasks with the same
    seed."""
    cached = data_dir / (f"compare_{split}.json" if policy == "rl" else f"compare_{policy}_{split}.json")
    key = {"k": k, "temperature": temperature, "policy": policy_hash(data_dir, policy), "v": SCORES_VERSION}
    if cached.exists() and (old := json.loads(cached.read_text()))["key"] == key:
        return old["scores"]
    from stages.evaluate_text import evaluate_policy  # the policy backends (torch): only to play

    params = load_params(proj / "params.yaml", [f"data_dir={data_dir}"])
    rows = evaluate_policy(params, policy, split, seed=params.eval_seed + 1, k=k, temperature=temperature,
                           groups=params.games.groups)
    out = {g: score([r for r in rows if r["group"] == g], k) for g in params.games.groups}
    out["all"] = score(rows, k)
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
        raise ToolError(f"--rows: bad row {row!r} (ALGORITHM/REWARD[+curriculum]; algorithms {', '.join(GRID)}; "
                        f"rewards {', '.join(REWARDS)})")
    return alg, reward, extra == "curriculum"


def compare_rl_text(project: Path, overrides: list[str], row_specs: list[str], val_k: int, eval_k: int,
                    temperature: float, configs: int | None, command: str) -> dict:
    """Run every row's grid, choose on val, score the chosen on held-out; the results (also written into the
    project dir, with ``command`` heading compare.md)."""
    rows = [parse_row(r) for r in row_specs]
    proj = project.resolve()
    make_project(proj, overrides)
    for stage in UPSTREAM:  # each resumes / is a no-op when already finished
        curio(proj, ["stage", stage])
    if any(reward == "motif" for _, reward, _ in rows):
        for stage in MOTIF_UPSTREAM:
            curio(proj, ["stage", stage, "-S", "rl_text.reward=motif"])
    data = proj / "data"
    dpo = {"val": evaluate(proj, data, "val", val_k, temperature, "dpo")["all"],
           "eval": evaluate(proj, data, "eval", eval_k, temperature, "dpo")}
    print(f"dpo (every row's start): val success {dpo['val']['success_rate']:.3f} ± {dpo['val']['se']:.3f}",
          flush=True)
    results = {"dpo": dpo, "rows": {}}
    for alg, reward, curriculum in rows:
        name = f"{alg}/{reward}" + ("+curriculum" if curriculum else "")
        runs = [run_config(proj, name, i, cfg, (alg, reward, curriculum), val_k, temperature)
                for i, cfg in enumerate(GRID[alg][:configs])]
        best = max(runs, key=val_rank)
        best["val_vs_dpo"] = paired(best["val"], dpo["val"])
        best["eval"] = evaluate(proj, Path(best["data"]), "eval", eval_k, temperature)
        best["eval_vs_dpo"] = {g: paired(s, dpo["eval"][g]) for g, s in best["eval"].items()}
        best["history"] = json.loads((Path(best["data"]) / "metrics" / "plots" / "rl_rounds.json").read_text())
        results["rows"][name] = {"chosen": best, "grid": runs}
        results["chosen_row"] = choose_row(results["rows"])
        write(proj, results, command)
    return results


def val_rank(run: dict) -> tuple[float, float]:
    """How a configuration ranks on val: success, then fewer turns on wins."""
    return run["val"]["success_rate"], -run["val"]["mean_turns"]


def choose_row(rows: dict[str, dict]) -> str:
    """The row whose chosen configuration ranks best on val (:func:`val_rank`)."""
    return max(rows, key=lambda n: val_rank(rows[n]["chosen"]))


def rl_overrides(data: Path, row: tuple[str, str, bool], cfg: list[str]) -> list[str]:
    """rl-text's params of one configuration of a row, in its own data dir."""
    alg, reward, curriculum = row
    return [f"data_dir={data}", f"metrics_dir={data / 'metrics'}", f"rl_text.algorithm={ALGORITHM.get(alg, alg)}",
            f"rl_text.reward={reward}", f"rl_text.curriculum.enabled={str(curriculum).lower()}", *cfg]


def run_config(proj: Path, name: str, i: int, cfg: list[str], row: tuple[str, str, bool], val_k: int,
               temperature: float) -> dict:
    """rl-text with the ``i``-th configuration of a row in its own data dir, scored on val."""
    alg, reward, curriculum = row
    data = proj / f"data_{alg}_{reward}{'_curriculum' if curriculum else ''}_{i}"
    data.mkdir(parents=True, exist_ok=True)
    for upstream in ("bootstrap", "train_policy", "reward_model_text"):
        if not (data / upstream).exists() and (proj / "data" / upstream).exists():
            os.symlink(proj / "data" / upstream, data / upstream)
    sets = rl_overrides(data, row, cfg)
    start = time.time()
    if not scored(data, "val"):  # a finished, scored run of an earlier call: not started again
        curio(proj, ["stage", "rl-text", *[x for s in sets for x in ("-S", s)]])
    val = evaluate(proj, data, "val", val_k, temperature)["all"]
    print(f"{name} {cfg}: val success {val['success_rate']:.3f} ± {val['se']:.3f}", flush=True)
    return {"config": cfg, "data": str(data), "val": val, "rl_seconds": round(time.time() - start)}


def pct(x: float | None, sign: str = "") -> str:
    """A share in points, one decimal (``sign="+"``: signed); "-" for none."""
    return "-" if x is None or math.isnan(x) else f"{100 * x:{sign}.1f}"


def write(proj: Path, results: dict, command: str) -> None:
    """compare.md: per row and group, held-out success ± s.e. (mean@k), pass@k, the paired difference from DPO, in
    points; the DPO start first; then the row chosen on val."""
    k = results["dpo"]["eval"]["all"]["k"]
    lines = [f"| algorithm / reward | chosen on val | val success (− DPO, paired) | env episodes | group | "
             f"held-out success ± s.e. = mean@{k} | pass@{k} | − DPO, paired ± s.e. (tasks) | "
             "mean turns (wins) | episodes |", "|---|---|---|---|---|---|---|---|---|---|"]
    dpo = results["dpo"]
    for group, s in dpo["eval"].items():
        lines.append(f"| dpo (the start) | | {pct(dpo['val']['success_rate'])} | 0 | {group} | "
                     f"{pct(s['success_rate'])} ± {pct(s['se'])} | {pct(s['pass_at_k'])} | | "
                     f"{s['mean_turns']:.2f} | {s['episodes']} |")
    curve = []
    for alg, res in results["rows"].items():
        best = res["chosen"]
        samples = best["history"][-1]["episodes"] if best["history"] else 0
        curve += [{**h, "algorithm": alg} for h in best["history"]]
        v = best["val_vs_dpo"]
        for group, s in best["eval"].items():
            d = best["eval_vs_dpo"][group]
            lines.append(f"| {alg} | {' '.join(best['config'])} | {pct(best['val']['success_rate'])} "
                         f"({pct(v['diff'], '+')} ± {pct(v['se'])}) | {samples} | {group} | "
                         f"{pct(s['success_rate'])} ± {pct(s['se'])} | {pct(s['pass_at_k'])} | "
                         f"{pct(d['diff'], '+')} ± {pct(d['se'])} ({d['tasks']}) | {s['mean_turns']:.2f} | "
                         f"{s['episodes']} |")
    lines += ["", f"Chosen on val: **{results['chosen_row']}** (the best val success; held-out informs no choice)."]
    (proj / "compare.md").write_text(f"`{command}`\n\n" + "\n".join(lines) + "\n")
    (proj / "compare.json").write_text(json.dumps(results, indent=1))
    (proj / "rl_compare.json").write_text(json.dumps(curve, indent=1))
    print("\n".join(lines))
