"""Choose a training stage's hyperparameters on the validation split, never on held-out tasks.

    OMP_NUM_THREADS=2 python bench/choose_hparams.py --preset presets/smollm2-learn.yaml --from data \
        [--policies base,sft,dpo,rl] [--stage train-sft --grid train_policy.sft.lr=1e-4,2e-4,5e-4] [--k 2]
    ... --stage pairs-text --through train-dpo --grid pairs_text.turn_threshold=0,1

Starts from a finished run's ``data/`` (``--from``): its upstream datasets are linked, read-only, into a scratch
directory per grid value (``--out``, default ``.cache/choose_hparams``), the stage (``train-sft``, ``train-dpo`` or
``rl-text``; or any stage upstream of one with ``--through``, which runs every stage between them in the DAG's
order, e.g. pairs-text → train-sft → reflogprobs → train-dpo) is run again there with that value, and every policy
it makes plays every ``val`` task
(``games.val_fraction`` of the train tasks, carved out before any training) ``--k`` times with the evaluation
sampling and the same seed for every value. ``--policies`` first plays the run's own policies on val (no training).
Prints val success ± standard error pooled over the groups and per group, mean turns on wins, and the value picked
(highest pooled val success; a tie keeps the first, so list the incumbent first). Writes every row to
``OUT/results.json``. Nothing under ``--from`` is written.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from choose_tiers import score  # noqa: E402 - success ± s.e. and mean turns on wins, as the tiers were chosen

#: the policy each stage trains
POLICY = {"train-sft": "sft", "train-dpo": "dpo", "rl-text": "rl"}


def remade(stage: str, dvc_yaml: Path = REPO / "dvc.yaml") -> tuple[str, ...]:
    """What retraining ``stage`` remakes, relative to data/: its own outs and those of every stage downstream of it
    (dvc.yaml's graph), so none of them is linked from the finished run."""
    from pipeline.core.dag import ancestors, stage_parents

    parents = stage_parents(dvc_yaml)
    stages = yaml.safe_load(dvc_yaml.read_text())["stages"]
    names = [n for n in parents if n == stage or stage in ancestors(parents, n)]
    outs = (next(iter(o)) if isinstance(o, dict) else o for n in names for o in stages[n].get("outs", []))
    return tuple(sorted(o.removeprefix("data/").rstrip("/") for o in outs if o.startswith("data/")))


def chain(stage: str, through: str, dvc_yaml: Path = REPO / "dvc.yaml") -> list[str]:
    """The stages to run again, in dvc.yaml's order: ``stage``, ``through`` and every stage downstream of the first
    and upstream of the second."""
    from pipeline.core.dag import ancestors, stage_parents

    parents = stage_parents(dvc_yaml)
    if stage != through and stage not in ancestors(parents, through):
        raise SystemExit(f"choose_hparams: {through} is not downstream of {stage}")
    return [n for n in parents if n in (stage, through)
            or (stage in ancestors(parents, n) and n in ancestors(parents, through))]


def link_upstream(src: Path, dst: Path, redo: tuple[str, ...], rel: str = "") -> None:
    """Symlink every entry of ``src`` into ``dst`` except the paths ``redo`` names (their parents become real
    directories, so the stage writes its outputs into the scratch tree, never into ``src``)."""
    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        path = f"{rel}{entry.name}"
        if path in redo:
            continue
        if any(r.startswith(path + "/") for r in redo):
            link_upstream(entry, dst / entry.name, redo, path + "/")
        elif not (dst / entry.name).exists():
            (dst / entry.name).symlink_to(entry.resolve())


def val_rows(params, policy: str, k: int) -> list[dict]:
    from pipeline.core.artifacts import chunk_seed
    from stages.evaluate import evaluate_policy

    seed = chunk_seed(params.seed, "choose-hparams", 0)  # one seed for every value: common random numbers
    return evaluate_policy(params, policy, "val", seed, k, params.evaluate_text.temperature)


def report(label: str, rows: list[dict], groups: list[str]) -> dict:
    pooled = score(rows)
    per = {g: score([r for r in rows if r["group"] == g]) for g in groups}
    cells = "  ".join(f"{g} {c['success_rate']:.1%} ± {c['se']:.1%} ({c['mean_turns_wins']:.2f})"
                      for g, c in per.items())
    print(f"{label:<40} val {pooled['success_rate']:.1%} ± {pooled['se']:.1%} (n={pooled['episodes']}, "
          f"turns on wins {pooled['mean_turns_wins']:.2f})  |  {cells}", flush=True)
    return {"label": label, **pooled, "groups": per}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default=None, help="a params preset, e.g. presets/smollm2-learn.yaml")
    ap.add_argument("-S", dest="overrides", action="append", default=[], help="params override, key=value")
    ap.add_argument("--from", dest="source", type=Path, default=REPO / "data", help="a finished run's data dir")
    ap.add_argument("--policies", default="", help="the run's own policies to play on val first, e.g. base,sft")
    ap.add_argument("--stage", help="the stage to run again per grid value (train-sft, train-dpo, rl-text, or one "
                    "upstream of --through)")
    ap.add_argument("--through", choices=sorted(POLICY), default=None,
                    help="also run every stage after --stage up to this one (default: --stage itself)")
    ap.add_argument("--grid", action="append", default=[], help="KEY=V1,V2,... (one or more; their product)")
    ap.add_argument("--k", type=int, default=2, help="episodes per val task")
    ap.add_argument("--out", type=Path, default=REPO / ".cache" / "choose_hparams")
    args = ap.parse_args()
    if args.grid and not args.stage:
        ap.error("--grid needs --stage")
    through = args.through or args.stage
    if args.stage and through not in POLICY:
        ap.error(f"--stage {args.stage} trains no policy: add --through {'|'.join(sorted(POLICY))}")
    stages = chain(args.stage, through) if args.stage else []

    os.environ.setdefault("TQDM_DISABLE", "1")
    from pipeline.core.config import preset_overrides
    from pipeline.core.stage import execute
    from pipeline.params import load_params
    from pipeline.text.policies import eval_groups

    base = [*(preset_overrides(args.preset) if args.preset else []), *args.overrides, "tracking.enabled=false"]
    source = args.source.resolve()
    results = []
    params = load_params("params.yaml", [*base, f"data_dir={source}"])
    groups = eval_groups(params)
    for policy in filter(None, args.policies.split(",")):
        t0 = time.perf_counter()
        results.append(report(f"{policy} (the run's)", val_rows(params, policy, args.k), groups))
        results[-1]["seconds"] = round(time.perf_counter() - t0, 1)
    axes = [(key, values.split(",")) for key, _, values in (g.partition("=") for g in args.grid)]
    for combo in itertools.product(*(values for _, values in axes)) if axes else ():
        sets = [f"{key}={value}" for (key, _), value in zip(axes, combo, strict=True)]
        label = " ".join(sets)
        work = args.out / args.stage / ("_".join(sets).replace("/", "-"))
        link_upstream(source, work / "data", remade(args.stage))
        params = load_params("params.yaml", [*base, *sets, f"data_dir={work / 'data'}",
                                             f"metrics_dir={work / 'metrics'}"])
        t0 = time.perf_counter()
        for stage in stages:
            execute(stage, params)
        trained = time.perf_counter() - t0
        for policy in (POLICY[s] for s in stages if s in POLICY):  # the last one is the value's figure
            results.append(report(f"{policy}: {label}", val_rows(params, policy, args.k), groups))
            results[-1].update(sets=sets, policy=policy, train_seconds=round(trained, 1),
                               seconds=round(time.perf_counter() - t0, 1))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    grid = [r for r in results if "sets" in r and r["policy"] == POLICY[through]]
    if grid:
        best = max(grid, key=lambda r: r["success_rate"])  # max keeps the first of a tie
        print(f"picked on val: {' '.join(best['sets'])} ({best['success_rate']:.1%} ± {best['se']:.1%})")


if __name__ == "__main__":
    main()
