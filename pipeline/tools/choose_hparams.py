"""Choose a training stage's hyperparameters on the validation split, never on held-out tasks
(``curio choose hparams``).

Starts from a finished run's ``data/`` (``--from``): its upstream datasets are linked, read-only, into a scratch
directory per grid value (``--out``, default ``.cache/choose_hparams``), the stage (``train-sft``, ``train-dpo`` or
``rl-text``; or any stage upstream of one with ``--through``, which runs every stage between them in the DAG's
order, e.g. pairs-text → train-sft → reflogprobs → train-dpo) is run again there with that value, and every policy
it makes plays every ``val`` task (``games.val_fraction`` of the train tasks, carved out before any training)
``--k`` times with the evaluation sampling and the same seed for every value. ``--policies`` first plays the run's
own policies on val (no training). Prints val success ± standard error pooled over the groups and per group, mean
turns on wins, and the value picked (highest pooled val success; a tie keeps the first, so list the incumbent
first). Writes every row to ``OUT/results.json`` as it is made: a rerun skips the rows already there. Nothing under
``--from`` is written.

Values are the product of ``--grid``'s axes, then each ``--candidate`` (a set of ``KEY=VALUE`` settings, for
candidates that are not a product, e.g. a credit with a reward). Over training seeds: each ``--exp NAME`` is a
finished DVC experiment (``curio sweep seeds``' ``PRESET-seed-K``, of this commit or an earlier one); its data/ is
copied out of DVC's cache (the workspace is left as it is), every value is trained again with that experiment's
seed, and the table gives each value's val success per seed, its mean ± s.e. across seeds and its paired difference
from the first row; the value picked has the highest mean across seeds.

``--held-out`` then reports, once the choice is made (every row there), the value picked and the first value on the
held-out split, played as evaluate-text plays (its tasks, ``evaluate_text.trajectories_per_task`` episodes and
``eval_seed``), beside the run's own policies (``--policies``): each one's held-out success per seed and the paired
differences per task (picked − first; each value − each run policy), with their mean ± s.e. across seeds. It never
changes the pick; its rows go to ``OUT/held_out.json`` (a rerun skips them).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

import yaml

from pipeline.core.artifacts import chunk_seed
from pipeline.core.config import preset_overrides
from pipeline.core.dag import ancestors, stage_parents
from pipeline.core.locks import LOCK_DIR
from pipeline.params import load_params
from pipeline.text.policies import eval_groups
from pipeline.tools import REPO, ToolError, require_val_split
from pipeline.tools.choose_tiers import score  # success ± s.e. and mean turns on wins, as the tiers were chosen

#: the policy each stage trains
POLICY = {"train-sft": "sft", "train-dpo": "dpo", "rl-text": "rl"}


def remade(stage: str, dvc_yaml: Path = REPO / "dvc.yaml") -> tuple[str, ...]:
    """What retraining ``stage`` remakes, relative to data/: its own outs and those of every stage downstream of it
    (dvc.yaml's graph), so none of them is linked from the finished run."""
    parents = stage_parents(dvc_yaml)
    stages = yaml.safe_load(dvc_yaml.read_text())["stages"]
    names = [n for n in parents if n == stage or stage in ancestors(parents, n)]
    outs = (next(iter(o)) if isinstance(o, dict) else o for n in names for o in stages[n].get("outs", []))
    return tuple(sorted(o.removeprefix("data/").rstrip("/") for o in outs if o.startswith("data/")))


def chain(stage: str, through: str, dvc_yaml: Path = REPO / "dvc.yaml") -> list[str]:
    """The stages to run again, in dvc.yaml's order: ``stage``, ``through`` and every stage downstream of the first
    and upstream of the second."""
    parents = stage_parents(dvc_yaml)
    for name in (stage, through):
        if name not in parents:
            raise ToolError(f"--stage / --through: no stage {name!r} in dvc.yaml")
    if stage != through and stage not in ancestors(parents, through):
        raise ToolError(f"choose hparams: {through} is not downstream of {stage}")
    return [n for n in parents if n in (stage, through)
            or (stage in ancestors(parents, n) and n in ancestors(parents, through))]


def link_upstream(src: Path, dst: Path, redo: tuple[str, ...], rel: str = "") -> None:
    """Symlink every entry of ``src`` into ``dst`` except the paths ``redo`` names (their parents become real
    directories, so the stage writes its outputs into the scratch tree, never into ``src``) and the run's output
    locks (the scratch tree's stages take locks of their own: a stage still running in ``src`` never blocks them)."""
    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        path = f"{rel}{entry.name}"
        if path in redo or path == LOCK_DIR:
            continue
        if any(r.startswith(path + "/") for r in redo):
            link_upstream(entry, dst / entry.name, redo, path + "/")
        elif not (dst / entry.name).exists():
            (dst / entry.name).symlink_to(entry.resolve())


def val_rows(params, policy: str, k: int) -> list[dict]:
    from stages.evaluate_text import evaluate_policy  # the policy backends (torch): only to play

    seed = chunk_seed(params.eval_seed, "choose-hparams", 0)  # one seed for every value: common random numbers
    return evaluate_policy(params, policy, "val", seed, k, params.evaluate_text.temperature)


def report(label: str, rows: list[dict], groups: list[str]) -> dict:
    pooled = score(rows)
    per = {g: score([r for r in rows if r["group"] == g]) for g in groups}
    cells = "  ".join(f"{g} {c['success_rate']:.1%} ± {c['se']:.1%} ({c['mean_turns_wins']:.2f})"
                      for g, c in per.items())
    print(f"{label:<40} val {pooled['success_rate']:.1%} ± {pooled['se']:.1%} (n={pooled['episodes']}, "
          f"turns on wins {pooled['mean_turns_wins']:.2f})  |  {cells}", flush=True)
    return {"label": label, **pooled, "groups": per}


def grid_axes(grid: list[str]) -> list[tuple[str, list[str]]]:
    """``KEY=V1,V2,...`` -> (KEY, [V1, V2, ...]) per ``--grid``."""
    axes = []
    for g in grid:
        key, eq, values = g.partition("=")
        if not eq or not key or not all(values.split(",")):
            raise ToolError(f"--grid {g!r}: expected KEY=V1,V2,...")
        axes.append((key, values.split(",")))
    return axes


def stages_to_run(stage: str | None, through: str | None, grid: list[str]) -> list[str]:
    """The stages each grid value runs again (none without ``stage``); the options checked."""
    if grid and not stage:
        raise ToolError("--grid needs --stage")
    if through and through not in POLICY:
        raise ToolError(f"--through {through}: one of {', '.join(sorted(POLICY))}")
    if not stage:
        return []
    through = through or stage
    if through not in POLICY:
        raise ToolError(f"--stage {stage} trains no policy: add --through {'|'.join(sorted(POLICY))}")
    return chain(stage, through)


def candidate_sets(grid: list[str], candidates: list[str]) -> list[list[str]]:
    """The overrides each value trains with: the product of ``--grid``'s axes, then each ``--candidate`` (its
    ``KEY=VALUE`` settings split on spaces; an empty one trains with the preset's values as they are)."""
    axes = grid_axes(grid)
    sets = [[f"{key}={value}" for (key, _), value in zip(axes, combo, strict=True)]
            for combo in (itertools.product(*(values for _, values in axes)) if axes else ())]
    for c in candidates:
        settings = c.split()
        bad = [x for x in settings if not x.partition("=")[1] or not x.partition("=")[0]]
        if bad:
            raise ToolError(f"--candidate {c!r}: expected KEY=VALUE settings separated by spaces")
        sets.append(settings)
    return sets


def label_of(sets: list[str]) -> str:
    return " ".join(sets) or "(the preset's values)"


def materialize(name: str, out: Path) -> tuple[Path, int]:
    """Experiment ``name``'s data/ at its commit, copied out of DVC's cache into ``OUT/exps/NAME/data`` once (a
    rerun reuses a finished copy), and its training seed. The checkout's workspace is left as it is."""
    import shutil

    from dvc.api import DVCFileSystem

    rev = finished_ref(name)
    fs = DVCFileSystem(str(REPO), rev=rev)
    params = yaml.safe_load(fs.read_text("params.yaml")) or {}
    dest = out / "exps" / name
    if not (dest / ".complete").exists():
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        src = str(params.get("data_dir") or "data").rstrip("/")
        never_run = []
        for entry in fs.ls(src, detail=False):
            rel = Path(entry).name
            if rel in ("seeds", LOCK_DIR):
                continue
            try:
                fs.get(entry, str(dest / "data" / rel), recursive=fs.isdir(entry))
            except FileNotFoundError:  # an out of dvc.yaml that the experiment's targets never ran (no hash)
                shutil.rmtree(dest / "data" / rel, ignore_errors=True)
                never_run.append(rel)
        if never_run:
            print(f"{name}: not made by the experiment, not copied: {', '.join(sorted(never_run))}", flush=True)
        (dest / ".complete").write_text(rev)
    return dest / "data", int(params.get("seed", 0))


def finished_ref(name: str) -> str:
    """The commit of a finished experiment ``name`` made on any commit (DVC keeps each under
    ``refs/exps/<baseline>/<name>``), so that values can be chosen with today's code on policies an earlier
    commit trained; a one-line error where there is none or the name is ambiguous."""
    import subprocess

    out = subprocess.run(["git", "for-each-ref", "--format=%(objectname) %(refname)", "refs/exps/"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    # a finished experiment's ref is refs/exps/<baseline[:2]>/<baseline[2:]>/<name>; the queue's stash and exec
    # refs have other shapes
    finished = {}
    for rev, ref in (line.split() for line in out.splitlines()):
        parts = ref.split("/")
        if len(parts) == 5:
            finished.setdefault(parts[4], []).append(rev)
    revs = finished.get(name, [])
    if len(revs) > 1:
        raise ToolError(f"--exp {name}: {len(revs)} experiments by that name on different commits "
                        f"(`dvc exp list -A`); remove the older ones with `dvc exp remove`")
    if not revs:
        raise ToolError(f"--exp {name}: no finished experiment by that name (finished: "
                        f"{', '.join(sorted(finished)) or 'none'})")
    return revs[0]


def seed_cells(results: list[dict]) -> tuple[list[str], dict[tuple[str, str], float]]:
    """The runs (training seeds) in the order their rows came, and each (run, label)'s val success."""
    return (list(dict.fromkeys(r["run"] for r in results)),
            {(r["run"], r["label"]): r["success_rate"] for r in results})


def seed_differences(by: dict[tuple[str, str], float], runs: list[str], a: str, b: str) -> list[float | None]:
    """``a`` − ``b`` in each run (over the same val tasks and episodes); None where either has no row."""
    return [by[(run, a)] - by[(run, b)] if (run, a) in by and (run, b) in by else None for run in runs]


def across_seeds(results: list[dict], labels: list[str]) -> list[str]:
    """Each value's val success per training seed, its mean ± s.e. across seeds, and its paired difference from
    the first value (per seed, over the same val tasks and episodes), with how many seeds agree in sign."""
    runs, by = seed_cells(results)
    lines = [f"| val success, % | {' | '.join(runs)} | mean ± s.e. over seeds | − first, ± s.e. | seeds > 0 |",
             "|---|" + "---|" * (len(runs) + 3)]
    first = labels[0]
    for label in labels:
        vals = [by.get((run, label)) for run in runs]
        got = [v for v in vals if v is not None]
        diffs = [d for d in seed_differences(by, runs, label, first) if d is not None]
        cells = " | ".join("" if v is None else f"{100 * v:.1f}" for v in vals)
        diff = "" if label == first or not diffs else f"{100 * mean(diffs):+.1f} ± {100 * se(diffs):.1f}"
        agree = "" if label == first or not diffs else f"{sum(d > 0 for d in diffs)}/{len(diffs)}"
        lines.append(f"| {label} | {cells} | {100 * mean(got):.1f} ± {100 * se(got):.1f} | {diff} | {agree} |")
    return lines


def value_differences(results: list[dict], labels: list[str]) -> list[str]:
    """Each value's val success − the first value's, policy by policy (``dpo: B`` − ``dpo: A``), per training seed
    (over the same val tasks and episodes), with mean ± s.e. across seeds and the seeds > 0; empty for one value."""
    runs, by = seed_cells(results)
    values = [lab for lab in labels if ": " in lab]
    first = {}  # policy -> its row of the first value
    for lab in values:
        first.setdefault(lab.partition(": ")[0], lab)
    pairs = [(lab, first[lab.partition(": ")[0]]) for lab in values if lab not in first.values()]
    if not pairs:
        return []
    lines = [f"| val, paired over the same tasks, points | {' | '.join(runs)} | mean ± s.e. over seeds | seeds > 0 |",
             "|---|" + "---|" * (len(runs) + 2)]
    for a, b in pairs:
        diffs = seed_differences(by, runs, a, b)
        got = [d for d in diffs if d is not None]
        cells = " | ".join("" if d is None else f"{100 * d:+.1f}" for d in diffs)
        lines.append(f"| {a} − {b} | {cells} | {100 * mean(got):+.1f} ± {100 * se(got):.1f} | "
                     f"{sum(d > 0 for d in got)}/{len(got)} |")
    return lines


def held_out_rows(params, policy: str) -> list[dict]:
    """``policy``'s held-out episodes as evaluate-text plays them (its seed, episodes per task and temperature)."""
    from stages.evaluate_text import evaluate_chunk  # the policy backends (torch): only to play

    return evaluate_chunk(params, None, 0, policy)


def held_out_table(cells: dict[tuple[str, str], dict], runs: list[str], labels: list[str],
                   pairs: list[tuple[str, str]]) -> list[str]:
    """Markdown, as ``curio table --seeds`` prints a sweep (pipeline.reporting.seeds): each label's held-out
    success per seed (± its evaluation s.e.), mean ± s.e. across seeds, s.d. across seeds beside the mean evaluation
    s.e.; then each pair's paired difference per task within a seed, the same columns and the seeds agreeing in sign.
    ``cells[(run, label)]`` holds ``success_rate``, ``se``, ``tasks`` ({task key: mean success}) and ``seed``."""
    from pipeline.reporting.breakdown import paired_difference
    from pipeline.reporting.seeds import Line, table_cells, table_text

    def seed_of(run: str) -> object:
        return next((c["seed"] for (r, _), c in cells.items() if r == run and "seed" in c), run)

    full = [run for run in runs if all((run, label) in cells for label in labels)]  # seeds with every cell
    seeds = [seed_of(run) for run in full]
    per_label = [Line(label, [cells[(run, label)]["success_rate"] for run in full],
                      [cells[(run, label)]["se"] for run in full]) for label in labels]
    per_pair = []
    for a, b in pairs:
        diffs = [paired_difference(cells[(run, a)]["tasks"], cells[(run, b)]["tasks"]) for run in full]
        per_pair.append(Line(f"{a} − {b}", [d for d, _, _ in diffs], [s for _, s, _ in diffs]))
    return [*table_text(*table_cells("held-out success, % (± evaluation s.e.)", per_label, seeds, 100, False)), "",
            *table_text(*table_cells("paired over the same tasks, points", per_pair, seeds, 100, True))]


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def se(xs: list[float]) -> float:
    """Standard error of the mean across seeds (0 for one seed)."""
    if len(xs) < 2:
        return 0.0
    m = mean(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs)) ** 0.5


def runs_of(source: Path, exps: list[str] | None) -> list[tuple[str, Path | None]]:
    """(name, data dir) of each run to choose on: the experiments (copied out of DVC's cache later), or ``source``."""
    if exps:
        return [(name, None) for name in exps]
    if not source.is_dir():
        raise ToolError(f"--from {source}: not a directory (a finished run's data/)")
    return [(str(source), source.resolve())]


def choose_hparams(preset: str | None, overrides: list[str], source: Path, policies: list[str], stage: str | None,
                   through: str | None, grid: list[str], k: int, out: Path, candidates: list[str] | None = None,
                   exps: list[str] | None = None, held_out: bool = False) -> list[dict]:
    """Play the run's own policies, then every value's retrained ones, on val, for the finished run at ``source``
    or for each experiment of ``exps`` (one training seed each, trained with its own seed); every row (also in
    ``OUT/results.json``, where a rerun finds the rows already made and skips them). With ``held_out``, then
    the value picked, the first value and the run's policies on the held-out split (``OUT/held_out.json``)."""
    from pipeline.core.stage import execute  # torch, MLflow and the stage's module: only to run one

    if candidates and not stage:
        raise ToolError("--candidate needs --stage")
    stages = stages_to_run(stage, through, grid)
    values = candidate_sets(grid, candidates or [])
    os.environ.setdefault("TQDM_DISABLE", "1")
    base = [*(preset_overrides(preset) if preset else []), *overrides, "tracking.enabled=false"]
    runs = runs_of(source, exps)
    results_path = out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else []
    done = {(r.get("run"), r["label"]) for r in results}

    def keep(row: dict) -> None:  # every row on disk as it is made: a killed choice resumes at the next one
        results.append(row)
        out.mkdir(parents=True, exist_ok=True)
        tmp = results_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1))
        tmp.replace(results_path)

    require_val_split(load_params("params.yaml", base))  # checked before any training: every value scored on val
    labels = [f"{policy} (the run's)" for policy in policies]
    last = POLICY[stages[-1]] if stages else None
    for sets in values:
        labels += [f"{POLICY[s]}: {label_of(sets)}" for s in stages if s in POLICY]
    if held_out and not stage:
        raise ToolError("--held-out needs --stage (it reports the value picked)")
    work_params: dict[tuple[str, str], object] = {}  # (run, label) -> the params its policy was trained with
    for run, src in runs:
        seed_set: list[str] = []
        if src is None:
            src, seed = materialize(run, out)
            seed_set = [f"seed={seed}"]
        params = load_params("params.yaml", [*base, *seed_set, f"data_dir={src}"])
        for policy in policies:
            work_params[(run, f"{policy} (the run's)")] = params
        groups = eval_groups(params.games)
        for policy in policies:
            label = f"{policy} (the run's)"
            if (run, label) in done:
                continue
            t0 = time.perf_counter()
            row = report(f"{label} [{run}]", val_rows(params, policy, k), groups)
            keep({**row, "label": label, "run": run, "seconds": round(time.perf_counter() - t0, 1)})
        for sets in values:
            made = [f"{POLICY[s]}: {label_of(sets)}" for s in stages if s in POLICY]
            slug = ("_".join(sets) or "preset").replace("/", "-").replace(" ", "")
            work = out / stage / run / slug if exps else out / stage / slug
            params = load_params("params.yaml", [*base, *seed_set, *sets, f"data_dir={work / 'data'}",
                                                 f"metrics_dir={work / 'metrics'}"])
            work_params[(run, made[-1])] = params
            if all((run, m) in done for m in made):
                continue
            link_upstream(src, work / "data", remade(stage))
            t0 = time.perf_counter()
            for name in stages:
                execute(name, params)
            trained = time.perf_counter() - t0
            for policy, label in zip((POLICY[s] for s in stages if s in POLICY), made, strict=True):
                row = report(f"{label} [{run}]", val_rows(params, policy, k), groups)
                keep({**row, "label": label, "run": run, "sets": sets, "policy": policy,
                      "train_seconds": round(trained, 1), "seconds": round(time.perf_counter() - t0, 1)})
    if len(runs) > 1:
        print("\n".join([*across_seeds(results, labels), "", *value_differences(results, labels)]), flush=True)
    named = {run for run, _ in runs}  # the pick is among this command's values and runs, whatever else the file holds
    best, by_label = pick([r for r in results if r["label"] in labels and r.get("run") in named], last, len(runs))
    if best and held_out:  # every value has its val rows by now: the loop above made what was missing
        report_held_out(out, [run for run, _ in runs], policies, [lab for lab in labels if lab in by_label],
                        best, work_params)
    return results


def pick(results: list[dict], last: str | None, n_runs: int) -> tuple[str | None, dict[str, list[float]]]:
    """The value whose policy of the last stage has the best mean val success (across seeds), printed with its
    spread; None when no value has a row yet."""
    rows = [r for r in results if r.get("policy") == last and "sets" in r]
    by_label: dict[str, list[float]] = {}
    for r in rows:
        by_label.setdefault(r["label"], []).append(r["success_rate"])
    if not rows:
        return None, by_label
    best = max(by_label, key=lambda lab: mean(by_label[lab]))  # max keeps the first of a tie
    spread = (f"± {100 * se(by_label[best]):.1f} over {len(by_label[best])} seeds" if n_runs > 1 else
              f"± {100 * next(r['se'] for r in rows if r['label'] == best):.1f}")
    print(f"picked on val: {best} ({100 * mean(by_label[best]):.1f} % {spread})")
    return best, by_label


def report_held_out(out: Path, runs: list[str], policies: list[str], values: list[str], best: str,
                    work_params: dict) -> list[str]:
    """The value picked and the first value, beside the run's policies, on the held-out split, once every value
    has its val rows: their table (``held_out_table``); every cell kept in ``OUT/held_out.json`` as it is made."""
    from pipeline.reporting.breakdown import task_means

    own = [f"{p} (the run's)" for p in policies]
    picked = list(dict.fromkeys([values[0], best]))
    path = out / "held_out.json"
    cells = {(c["run"], c["label"]): c for c in (json.loads(path.read_text()) if path.exists() else [])}
    for run in runs:
        for label in own + picked:
            if (run, label) in cells:
                continue
            policy = label.removesuffix(" (the run's)") if label in own else label.partition(":")[0]
            t0 = time.perf_counter()
            params = work_params[(run, label)]
            rows = held_out_rows(params, policy)
            tasks = {f"{g}/{t}": v for (g, t), v in task_means(rows).get(policy, {}).items()}
            cells[(run, label)] = {"run": run, "label": label, "seed": params.seed, **score(rows), "tasks": tasks,
                                   "seconds": round(time.perf_counter() - t0, 1)}
            print(f"{label} [{run}] held-out {cells[(run, label)]['success_rate']:.1%} ± "
                  f"{cells[(run, label)]['se']:.1%} (n={len(rows)})", flush=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(list(cells.values()), indent=1))
            tmp.replace(path)
    pairs = [(picked[-1], picked[0])] if len(picked) > 1 else []
    pairs += [(value, mine) for value in picked for mine in own]
    lines = held_out_table(cells, runs, own + picked, pairs)
    print(f"held-out, once, for the value picked on val ({best}) and the first value:", flush=True)
    print("\n".join(lines), flush=True)
    return lines
