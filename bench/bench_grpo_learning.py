"""GRPO's learning and rl-text's minutes against another revision's GRPO, from the same DPO start, side by side.

    OMP_NUM_THREADS=2 python bench/bench_grpo_learning.py --run DIR --before REF --scratch SCRATCH [--exp NAME ...]

``DIR`` is a checkout that ran ``presets/smollm2-learn.yaml`` to evaluate-text; each ``--exp NAME`` is one of its DVC
experiments (``curio sweep seeds``' ``smollm2-learn-seed-N``), applied there in turn (``dvc exp apply``); without
``--exp``, its workspace as it is. ``REF`` is a commit of this repository. For each run:

1. **before**: ``REF``'s rl-text, in a worktree of ``REF`` under ``SCRATCH``, on the run's own inputs (its SFT and DPO
   policies, tasks and params; a params key ``REF``'s code does not know is left out, and printed), with the
   run's training seed;
2. **evaluation**: this checkout's evaluate-text plays the RL policy of each side (``REF``'s and the run's own) on the
   run's held-out tasks and episodes (``eval_seed``), each in a data directory of its own under ``SCRATCH``. The run's
   side replays what the run's evaluate-text played: the script says whether its rows equal the run's;
3. **paired**: the run's RL − ``REF``'s RL over the same held-out tasks (the mean of per-task differences ± its s.e.).

Then, over the runs (training seeds): the mean paired difference ± its s.e. across seeds, and in how many it is > 0.
``SCRATCH`` takes about 6 GB of disk per run: the worktree with a copy of the run's inputs, and ``REF``'s model of
every round, which its rl-text keeps for its own resume. Every step resumes: a rerun finds ``REF``'s finished rl-text
(its metrics file) and each finished evaluation (evaluate-text's own resume) and plays nothing again. Each side's
rl-text minutes are printed (its metrics' ``seconds``). When done: ``rm -rf SCRATCH; git worktree prune``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: What rl-text reads of a finished run (evaluate-text's outputs and rl-text's own are left behind).
RL_INPUTS = ["annotate_text", "annotate_utterances", "bootstrap", "pairs_text", "params.ok", "reflogprobs",
             "reward_model_text", "rollout_text", "train_policy"]
CLI = "from pipeline.cli import app; app()"


def log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


def fail(message: str) -> None:
    """One line on stderr, exit code 2."""
    print(f"bench_grpo_learning: {message}", file=sys.stderr)
    sys.exit(2)


def curio(args: list[str], cwd: Path, code: Path) -> None:
    """``curio ARGS`` with the code of the checkout ``code`` on ``sys.path``, in ``cwd``; stops the script on a
    failure."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run([sys.executable, "-c", CLI, *args], cwd=cwd, env=env)
    if done.returncode:
        fail(f"curio {' '.join(args)} in {cwd}: exit {done.returncode} (its rerun resumes)")


def accepted_params(run: Path, dest: Path, code: Path) -> list[str]:
    """Write the run's params.yaml to ``dest`` less each key the code of the checkout ``code`` refuses as unknown
    (``bench_grpo_update.accepted_params``, run with that code on ``sys.path``); those keys."""
    script = f"""
import shutil, sys
from pathlib import Path
sys.path.insert(1, {str(Path(__file__).parent)!r})
from bench_grpo_update import accepted_params
run = Path({str(run)!r})
path, dropped = accepted_params(run, Path({str(dest.parent)!r}))
shutil.copyfile(path, {str(dest)!r})
if path != run / "params.yaml":  # its scratch copy
    path.unlink()
print(" ".join(dropped))
"""
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(code)},
                         capture_output=True, text=True, cwd=dest.parent)
    if out.returncode:
        fail(f"{code}'s params cannot read {run / 'params.yaml'}: {out.stderr.strip().splitlines()[-1]}")
    return out.stdout.split()


def copy_tree(src: Path, dst: Path, link: bool = False) -> None:
    """``src`` to ``dst`` (a file or a directory), hard-linked where ``link`` (read-only inputs of a scratch run)."""
    if dst.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, copy_function=os.link if link else shutil.copy2)
    else:
        (os.link if link else shutil.copy2)(src, dst)


def rl_before(run: Path, ref: str, work: Path) -> dict:
    """``REF``'s rl-text on the run's inputs in the worktree ``work``; its metrics."""
    metrics = work / "metrics" / "stages" / "rl-text.json"
    if not work.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(work), ref], cwd=REPO, check=True,
                       capture_output=True)
    dropped = accepted_params(run, work / "params.yaml", work)
    log(f"before: {ref}'s params leave out {', '.join(dropped) or 'nothing'}")
    for name in RL_INPUTS:
        copy_tree(run / "data" / name, work / "data" / name)
    if not metrics.is_file():
        log(f"before: {ref}'s rl-text in {work}")
        start = time.time()
        curio(["stage", "rl-text"], work, work)
        log(f"before: rl-text took {(time.time() - start) / 60:.1f} min")
    return json.loads(metrics.read_text())


def evaluate(params: Path, inputs: Path, model: Path, where: Path) -> list[dict]:
    """This checkout's evaluate-text of the RL policy ``model`` on the held-out episodes of the run whose
    ``params`` (its params.yaml) and ``inputs`` (a data directory holding its base and trained policies) are given,
    in ``where``; its held-out rows."""
    from pipeline.tools.compare_runs import evaluation_rows

    where.mkdir(parents=True, exist_ok=True)
    shutil.copy2(params, where / "params.yaml")
    for name in ["bootstrap", "params.ok", "train_policy"]:
        copy_tree(inputs / name, where / "data" / name, link=True)
    copy_tree(model, where / "data" / "rl_text" / "model", link=True)
    start = time.time()
    curio(["stage", "evaluate-text", "-S", "evaluate_text.policies=[rl]", "-S", "tracking.enabled=false"], where,
          REPO)
    log(f"evaluate-text of {model}: {(time.time() - start) / 60:.1f} min")
    return evaluation_rows(where)


def rl_rows(rows: list[dict]) -> list[dict]:
    return sorted(({k: r[k] for k in ("group", "task_id", "success")} for r in rows if r["policy"] == "rl"),
                  key=lambda r: (r["group"], r["task_id"]))


def success(rows: list[dict]) -> float:
    return sum(bool(r["success"]) for r in rows) / len(rows)


def rl_text_summary(metrics: dict) -> dict:
    """rl-text's early stopping on val and its wall time, from its metrics file."""
    # rl/: the shared rounds' names; grpo/: a revision before them
    names = {k.replace("grpo/", "rl/"): k for k in metrics if k.startswith("grpo/")}
    metrics = {**{new: metrics[old] for new, old in names.items()}, **metrics}
    return {k: metrics[k] for k in ("rl/chosen_round", "rl/val_success_start", "rl/val_success_chosen",
                                    "seconds") if k in metrics}


def one_run(run: Path, ref: str, scratch: Path, name: str) -> dict:
    import yaml

    from pipeline.reporting.breakdown import paired_difference, task_means
    from pipeline.tools.compare_runs import evaluation_rows

    seed = yaml.safe_load((run / "params.yaml").read_text())["seed"]
    base = scratch / name
    (base / "run").mkdir(parents=True, exist_ok=True)
    model = base / "run" / "rl_model"  # the run's RL policy, kept: the next --exp replaces the run's workspace
    copy_tree(run / "data" / "rl_text" / "model", model)
    for kept in ("params.yaml", "metrics/stages/rl-text.json"):
        shutil.copy2(run / kept, base / "run" / Path(kept).name)
    run_rows = rl_rows(evaluation_rows(run))
    before_metrics = rl_before(run, ref, base / "before")
    params, inputs = base / "run" / "params.yaml", base / "before" / "data"  # inputs: a copy of the run's
    before = evaluate(params, inputs, inputs / "rl_text" / "model", base / "eval-before")
    after = evaluate(params, inputs, model, base / "eval-after")
    d, se, n = paired_difference(task_means(after)["rl"], task_means(before)["rl"])
    result = {"name": name, "seed": seed, "before": success(before), "after": success(after), "paired": d, "se": se,
              "tasks": n, "replays_run": rl_rows(after) == run_rows,
              "before_rl_text": rl_text_summary(before_metrics),
              "after_rl_text": rl_text_summary(json.loads((base / "run" / "rl-text.json").read_text()))}
    log(f"{name} (seed {seed}): RL {ref} {result['before']:.3f}, this {result['after']:.3f}; this − {ref} "
        f"{d:+.4f} ± {se:.4f} over {n} tasks; this side replays the run's own RL rows: {result['replays_run']}")
    (base / "result.json").write_text(json.dumps(result, indent=2))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True, help="a checkout that ran the preset to evaluate-text")
    ap.add_argument("--before", required=True, help="the revision to compare with (a commit of this repository)")
    ap.add_argument("--scratch", type=Path, required=True, help="where the worktrees and evaluations go (resumed)")
    ap.add_argument("--exp", action="append", default=[], help="a DVC experiment of --run (repeat); default: its "
                                                              "workspace")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    run, scratch = args.run.resolve(), args.scratch.resolve()
    dvc = Path(sys.executable).with_name("dvc")
    if args.exp:  # an unknown name would leave the workspace as it is, under that name
        known = subprocess.run([str(dvc), "exp", "list", "--name-only"], cwd=run, capture_output=True,
                               text=True).stdout.split()
        unknown = [n for n in args.exp if n not in known]
        if unknown:
            fail(f"--exp {', '.join(unknown)}: not an experiment of {run} (dvc exp list: {', '.join(known)})")
    results = []
    for name in args.exp or [run.name]:
        if args.exp:
            subprocess.run([str(dvc), "exp", "apply", name], cwd=run, capture_output=True)  # nethack outs: absent
            log(f"{name} applied in {run}")
        results.append(one_run(run, args.before, scratch, name))
    ref = args.before
    print(f"\n| run | seed | round kept on val ({ref} / this) | val, DPO → kept, % ({ref} / this) | rl-text, min "
          f"({ref} / this) | held-out RL, % ({ref} / this) | this − {ref}, paired | tasks |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        b, a = r["before_rl_text"], r["after_rl_text"]
        val = " / ".join(f"{100 * m['rl/val_success_start']:.1f} → {100 * m['rl/val_success_chosen']:.1f}"
                         for m in (b, a))
        print(f"| {r['name']} | {r['seed']} | {b['rl/chosen_round']} / {a['rl/chosen_round']} | {val} | "
              f"{b['seconds'] / 60:.1f} / {a['seconds'] / 60:.1f} | {100 * r['before']:.1f} / {100 * r['after']:.1f} | "
              f"{100 * r['paired']:+.1f} ± {100 * r['se']:.1f} | {r['tasks']} |")
    diffs = [r["paired"] for r in results]
    if len(diffs) > 1:
        sem = statistics.stdev(diffs) / math.sqrt(len(diffs))
        print(f"\nover {len(diffs)} seeds: this − {args.before} {100 * statistics.mean(diffs):+.1f} ± {100 * sem:.1f} "
              f"points (s.e. across seeds); > 0 in {sum(d > 0 for d in diffs)} of {len(diffs)}")


if __name__ == "__main__":
    main()
