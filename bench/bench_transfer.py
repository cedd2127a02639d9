"""Does what a run trained transfer to games nobody here wrote? Its base, SFT, DPO and RL policies on external games.

    OMP_NUM_THREADS=2 python bench/bench_transfer.py --run DIR [--exp NAME] --scratch SCRATCH \\
        --game textarena:Mastermind-v0 --game textarena:GuessTheNumber-v0 [--tasks N] [--k K] [-S KEY=VALUE ...]

``DIR`` is a checkout that ran the text track to evaluate-text (e.g. ``presets/smollm2-learn.yaml``). With ``--exp
NAME`` (one of its DVC experiments, e.g. ``curio sweep seeds``' ``smollm2-learn-seed-0``) the policies and params are
that experiment's: its commit is checked out into a clone under ``SCRATCH`` (``git clone --shared``, the experiment's
ref fetched by name) and its policies are checked out there from the run's own DVC cache (``dvc checkout``, hard
links into the cache). Without ``--exp``, the run's workspace as it is (its data hard-linked). Nothing in ``DIR`` is
written: no ``dvc exp apply``, no change to its workspace, refs or experiments.

For each ``--game`` (a ``games.groups`` entry, tier included: ``textarena:GuessTheNumber-v0@max_turns=6``), this
checkout's evaluate-text plays every policy the run evaluated (``evaluate_text.policies``) on the game's held-out
tasks, in a directory of its own under ``SCRATCH``, with the run's params (its policy, sampling, ``eval_seed`` and
``evaluate_text`` settings) and only ``games.eval_groups`` set to the game; ``--tasks`` caps its held-out tasks
(default: the run's ``games.max_eval_tasks``), ``--k`` sets the episodes per task (default: the run's
``evaluate_text.trajectories_per_task``), ``-S`` adds any other override (e.g. ``policy.format_prompt=rule``).

Then one markdown table per game: each policy's held-out success ± its binomial s.e., mean turns on wins, the share
of episodes the game ended for an invalid move (TextArena's own ``Invalid Move`` end: a model that cannot write the
game's moves), the share Curio's turn limit ended; and the paired differences over the same tasks (the mean of the
per-task differences ± its s.e., pipeline.breakdown): sft − base, dpo − sft, rl − dpo and rl − base. The tables are
also written to ``SCRATCH/NAME/transfer.md`` and ``transfer.json``. Every step resumes: evaluate-text resumes per
policy, so a rerun plays nothing finished again. When done: ``rm -rf SCRATCH``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).parent))

from bench_grpo_learning import copy_tree, curio  # noqa: E402  (the same scratch dance: hard-linked inputs)
from bench_grpo_update import accepted_params  # noqa: E402

from pipeline.core.artifacts import read_rows  # noqa: E402
from pipeline.envs.external import hit_turn_limit  # noqa: E402
from pipeline.reporting.breakdown import paired_difference, task_means  # noqa: E402
from pipeline.text.play import pass_at_k  # noqa: E402
from pipeline.text.policies import POLICY_DEPS  # noqa: E402

#: The paired differences printed under each table: (policy, the policy it is compared with).
DIFFERENCES = [("sft", "base"), ("dpo", "sft"), ("rl", "dpo"), ("rl", "base")]
#: The last line TextArena's single-player games give an episode they end for an invalid move.
INVALID_END = re.compile(r"(^|\n)Invalid Move:[^\n]*$")
#: Where ``gguf:`` models are imported, relative to the directory a stage runs in (pipeline/models/gguf.py).
MODELS = Path(".cache/curio/models")


def log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


def fail(message: str) -> None:
    """One line on stderr, exit code 2."""
    print(f"bench_transfer: {message}", file=sys.stderr)
    sys.exit(2)


def git(args: list[str], cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        fail(f"git {' '.join(args)} in {cwd}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}")
    return done.stdout.strip()


def dvc(args: list[str], cwd: Path) -> str:
    done = subprocess.run([str(Path(sys.executable).with_name("dvc")), *args], cwd=cwd, capture_output=True,
                          text=True)
    if done.returncode:
        fail(f"dvc {' '.join(args)} in {cwd}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}")
    return done.stdout.strip()


def experiment_ref(run: Path, name: str) -> str:
    """The git ref DVC keeps experiment ``name`` of ``run`` under (``refs/exps/.../NAME``), read, not changed."""
    refs = [r for r in git(["for-each-ref", "--format=%(refname)", "refs/exps"], run).splitlines()
            if r.rsplit("/", 1)[-1] == name]
    if len(refs) != 1:
        known = sorted({r.rsplit("/", 1)[-1] for r in git(["for-each-ref", "--format=%(refname)", "refs/exps"],
                                                          run).splitlines()})
        fail(f"--exp {name}: {'not an experiment' if not refs else 'several experiments'} of {run} "
             f"(its experiments: {', '.join(known) or 'none'})")
    return refs[0]


def run_cache(run: Path) -> Path:
    """The run's DVC cache directory, read from its config (no dvc command runs in the run)."""
    from dvc.config import Config

    configured = Config(dvc_dir=run / ".dvc", validate=False)["cache"].get("dir")
    return (run / ".dvc" / configured).resolve() if configured else run / ".dvc" / "cache"


def policy_outs(params: dict) -> list[str]:
    """The data outs holding the policies the run evaluated (the built-in base: bootstrap's model)."""
    policies = params.get("evaluate_text", {}).get("policies") or ["base", "sft", "dpo", "rl"]
    builtin = params.get("policy", {}).get("model", "builtin") == "builtin"
    return [POLICY_DEPS[p] for p in policies if p != "base" or builtin]


def experiment_checkout(run: Path, name: str, scratch: Path) -> Path:
    """A clone of ``run`` at experiment ``name``'s commit under ``scratch``, its policies checked out of the run's
    DVC cache; the clone."""
    clone = scratch / "checkout"
    ref = experiment_ref(run, name)
    if not (clone / ".git").is_dir():
        shutil.rmtree(clone, ignore_errors=True)
        git(["clone", "--quiet", "--shared", "--no-checkout", str(run), str(clone)], scratch)
    git(["fetch", "--quiet", str(run), ref], clone)
    git(["checkout", "--quiet", "--detach", "--force", "FETCH_HEAD"], clone)
    dvc(["config", "--local", "cache.dir", str(run_cache(run))], clone)  # its files are hard-linked into the clone
    dvc(["config", "--local", "cache.type", "hardlink,copy"], clone)
    import yaml

    outs = policy_outs(yaml.safe_load((clone / "params.yaml").read_text()))
    log(f"{name}: {ref} checked out in {clone}; dvc checkout {' '.join(outs)}")
    dvc(["checkout", "--quiet", *outs], clone)
    return clone


def game_slug(game: str) -> str:
    return re.sub(r"[^A-Za-z0-9.-]+", "_", game).strip("_")


def evaluate_game(source: Path, run: Path, game: str, where: Path, overrides: list[str]) -> list[dict]:
    """This checkout's evaluate-text of the run's policies (in ``source``: a checkout holding its params.yaml and
    data) on ``game``'s held-out tasks, in ``where``; its rows."""
    import yaml

    where.mkdir(parents=True, exist_ok=True)
    params, dropped = accepted_params(source, where)  # less any key this checkout's code does not know
    if dropped:
        log(f"{game}: this checkout's params leave out {', '.join(dropped)}")
    shutil.copy2(params, where / "params.yaml")
    if params != source / "params.yaml":  # accepted_params' scratch copy
        params.unlink()
    for out in policy_outs(yaml.safe_load((source / "params.yaml").read_text())):
        if not (source / out).exists():
            fail(f"{source / out}: the run has no such policy (did it run to evaluate-text?)")
        copy_tree(source / out, where / out, link=True)
    if (run / MODELS).is_dir():  # the run's imported gguf: models (its base, and the base of LoRA adapters)
        copy_tree(run / MODELS, where / MODELS, link=True)
    sets = [f"games.eval_groups={json.dumps([game])}", "tracking.enabled=false", *overrides]
    start = time.time()
    curio(["stage", "evaluate-text", *(arg for s in sets for arg in ("-S", s))], where, REPO)
    log(f"{game}: evaluate-text in {where}: {(time.time() - start) / 60:.1f} min")
    return read_rows(where / "data" / "evaluate_text")


def invalid_end(row: dict) -> bool:
    return bool(row["conversation"]) and INVALID_END.search(row["conversation"][-1]["content"].strip()) is not None


def game_table(game: str, rows: list[dict]) -> tuple[list[str], dict]:
    """The markdown table of one game and its figures."""
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    tasks = len({r["task_id"] for r in rows})
    k = len(rows) // max(1, tasks * len(policies))
    figures: dict = {"game": game, "tasks": tasks, "episodes_per_task": k, "policies": {}, "paired": {}}
    lines = [f"### {game}: {tasks} held-out tasks × {k} episodes per policy", "",
             "| policy | success, % ± s.e. | mean turns on wins | pass@4, % | ended by an invalid move, % "
             "| ended by Curio's turn limit, % |", "|---|---|---|---|---|---|"]
    for p in policies:
        mine = [r for r in rows if r["policy"] == p]
        wins = [r for r in mine if r["success"]]
        s = len(wins) / len(mine)
        se = math.sqrt(s * (1 - s) / len(mine))
        turns = sum(r["turns"] for r in wins) / len(wins) if wins else math.nan
        passed = pass_at_k(mine, 4)
        invalid = sum(map(invalid_end, mine)) / len(mine)
        limit = sum(hit_turn_limit(r["conversation"]) for r in mine) / len(mine)
        figures["policies"][p] = {"success": s, "se": se, "episodes": len(mine), "mean_turns_on_wins": turns,
                                  "pass@4": passed, "invalid_end": invalid, "turn_limit": limit}
        lines.append(f"| {p} | {100 * s:.1f} ± {100 * se:.1f} | {turns:.2f} | "
                     f"{'-' if passed is None else f'{100 * passed:.1f}'} | {100 * invalid:.1f} | {100 * limit:.1f} |")
    means = task_means(rows)
    lines += ["", "| paired over the same tasks | points ± s.e. | tasks |", "|---|---|---|"]
    for p, q in DIFFERENCES:
        if p in means and q in means:
            d, se, n = paired_difference(means[p], means[q])
            figures["paired"][f"{p}-{q}"] = {"d": d, "se": se, "tasks": n}
            lines.append(f"| {p} − {q} | {100 * d:+.1f} ± {100 * se:.1f} | {n} |")
    return lines, figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True, help="a checkout that ran the text track to evaluate-text")
    ap.add_argument("--exp", help="one of its DVC experiments (e.g. smollm2-learn-seed-0); default: its workspace")
    ap.add_argument("--game", action="append", required=True, help="a games.groups entry (repeat)")
    ap.add_argument("--scratch", type=Path, required=True, help="where the checkout and evaluations go (resumed)")
    ap.add_argument("--tasks", type=int, help="held-out tasks per game (default: the run's games.max_eval_tasks)")
    ap.add_argument("--k", type=int, help="episodes per task (default: the run's evaluate_text.trajectories_per_task)")
    ap.add_argument("-S", "--set", action="append", default=[], dest="overrides", help="another override KEY=VALUE")
    args = ap.parse_args()
    run, scratch = args.run.resolve(), args.scratch.resolve()
    if not (run / "params.yaml").is_file():
        fail(f"--run {run}: no params.yaml there (a checkout that ran the text track)")
    if scratch == run or run in scratch.parents:
        fail(f"--scratch {scratch}: must lie outside the run ({run})")
    name = args.exp or run.name
    base = scratch / name
    base.mkdir(parents=True, exist_ok=True)
    source = experiment_checkout(run, args.exp, base) if args.exp else run
    overrides = [*([f"games.max_eval_tasks={args.tasks}"] if args.tasks else []),
                 *([f"evaluate_text.trajectories_per_task={args.k}"] if args.k else []), *args.overrides]
    lines = [f"{name} ({run}), this checkout's evaluate-text, overrides: {' '.join(overrides) or 'none'}", ""]
    figures = []
    for game in args.game:
        rows = evaluate_game(source, run, game, base / f"eval-{game_slug(game)}", overrides)
        table, fig = game_table(game, rows)
        lines += [*table, ""]
        figures.append(fig)
    text = "\n".join(lines)
    (base / "transfer.md").write_text(text + "\n")
    (base / "transfer.json").write_text(json.dumps({"run": str(run), "exp": args.exp, "overrides": overrides,
                                                    "games": figures}, indent=2))
    print("\n" + text)


if __name__ == "__main__":
    main()
