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
first). Writes every row to ``OUT/results.json``. Nothing under ``--from`` is written.
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


def choose_hparams(preset: str | None, overrides: list[str], source: Path, policies: list[str], stage: str | None,
                   through: str | None, grid: list[str], k: int, out: Path) -> list[dict]:
    """Play the run's own policies, then every grid value's retrained ones, on val; every row (also in
    ``OUT/results.json``)."""
    from pipeline.core.stage import execute  # torch, MLflow and the stage's module: only to run one

    stages = stages_to_run(stage, through, grid)
    axes = grid_axes(grid)
    if not source.is_dir():
        raise ToolError(f"--from {source}: not a directory (a finished run's data/)")
    os.environ.setdefault("TQDM_DISABLE", "1")
    base = [*(preset_overrides(preset) if preset else []), *overrides, "tracking.enabled=false"]
    source = source.resolve()
    results = []
    params = load_params("params.yaml", [*base, f"data_dir={source}"])
    require_val_split(params)  # checked before any training: every value is scored on val
    groups = eval_groups(params)
    for policy in policies:
        t0 = time.perf_counter()
        results.append(report(f"{policy} (the run's)", val_rows(params, policy, k), groups))
        results[-1]["seconds"] = round(time.perf_counter() - t0, 1)
    for combo in itertools.product(*(values for _, values in axes)) if axes else ():
        sets = [f"{key}={value}" for (key, _), value in zip(axes, combo, strict=True)]
        label = " ".join(sets)
        work = out / stage / ("_".join(sets).replace("/", "-"))
        link_upstream(source, work / "data", remade(stage))
        params = load_params("params.yaml", [*base, *sets, f"data_dir={work / 'data'}",
                                             f"metrics_dir={work / 'metrics'}"])
        t0 = time.perf_counter()
        for name in stages:
            execute(name, params)
        trained = time.perf_counter() - t0
        for policy in (POLICY[s] for s in stages if s in POLICY):  # the last one is the value's figure
            results.append(report(f"{policy}: {label}", val_rows(params, policy, k), groups))
            results[-1].update(sets=sets, policy=policy, train_seconds=round(trained, 1),
                               seconds=round(time.perf_counter() - t0, 1))
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    grid_rows = [r for r in results if "sets" in r and r["policy"] == POLICY[stages[-1]]] if stages else []
    if grid_rows:
        best = max(grid_rows, key=lambda r: r["success_rate"])  # max keeps the first of a tie
        print(f"picked on val: {' '.join(best['sets'])} ({best['success_rate']:.1%} ± {best['se']:.1%})")
    return results
