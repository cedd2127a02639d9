"""Prefect flows: one per stage, ``pipeline`` (the whole DAG, in dvc.yaml order) and ``eval-sweep``.

The ``pipeline`` flow runs exactly the code ``dvc repro`` runs (``pipeline.core.stage.execute``), skips stages
DVC already considers up to date, and records each finished stage with ``dvc commit`` so ``dvc.lock`` stays
consistent: a ``dvc repro`` afterwards does nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # before prefect reads its settings
# The ephemeral API (no PREFECT_API_URL) gets 20 s to start by default; on a loaded 2-core machine it needs more.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.states import Cancelled  # noqa: E402

from pipeline.core import dvcrepo, interrupt  # noqa: E402
from pipeline.core.artifacts import atomic_write_bytes, atomic_write_json  # noqa: E402
from pipeline.core.dag import dag_order  # noqa: E402
from pipeline.core.errors import CurioError  # noqa: E402
from pipeline.core.runners import started  # noqa: E402
from pipeline.core.stage import STAGES, execute  # noqa: E402
from pipeline.core.tracking import pipeline_run  # noqa: E402
from pipeline.params import (
    Params,  # noqa: E402
    load_params,  # noqa: E402
)
from pipeline.reporting.report import stage_metrics, summaries, write_report  # noqa: E402
from pipeline.text.play import summarize  # noqa: E402
from pipeline.text.policies import eval_groups  # noqa: E402


def _params(params_file: str, overrides: dict[str, Any] | None) -> Params:
    return load_params(params_file, overrides or {})


def _stage_flow(stage: str):
    @flow(name=stage, log_prints=True)
    def run_stage(params_file: str = "params.yaml", overrides: dict[str, Any] | None = None) -> Any:
        try:
            return execute(stage, _params(params_file, overrides)).metrics
        except interrupt.Stopped as e:  # SIGTERM (a cancelled flow run): the stage saved its work; its line
            get_run_logger().warning("curio: %s", e)
            return Cancelled(message=str(e))
        except (CurioError, FileNotFoundError) as e:  # the line `curio stage` prints, then the flow fails
            get_run_logger().error("curio: %s", str(e).strip().splitlines()[0] if str(e).strip() else e)
            raise

    return run_stage


STAGE_FLOWS = {name: _stage_flow(name) for name in STAGES}


@flow(name="report", log_prints=True)
def report_flow(params_file: str = "params.yaml", overrides: dict[str, Any] | None = None) -> str:
    """The last node of dvc.yaml: track summaries and the HTML report (``curio report``)."""
    return str(write_report(_params(params_file, overrides)).resolve())


def _publish(summary: dict[str, str], params: Params) -> None:
    """Prefect artifacts of a pipeline run: what ran, the headline numbers, a link to the report."""
    from prefect.artifacts import create_markdown_artifact

    from pipeline.orchestration.artifact_links import files_markdown

    lines = ["| stage | status |", "|---|---|", *(f"| {k} | {v} |" for k, v in summary.items())]
    for track, sections in summaries(stage_metrics(params.metrics_path())).items():
        for name, values in sections.items():
            lines += ["", f"**{track}: {name}**", "", "| policy | value |", "|---|---|",
                      *(f"| {p} | {v:.4g} |" for p, v in values.items())]
    create_markdown_artifact("\n".join(lines), key="pipeline-summary", description="stages run and headline numbers")
    report = params.data_path("report.html")
    if report.exists():
        create_markdown_artifact("The run's report, one self-contained HTML page:\n\n"
                                 + files_markdown([report], Path(params.data_dir)), key="pipeline-report",
                                 description="one self-contained HTML page of the run")


@flow(name="pipeline", log_prints=True)
def pipeline_flow(params_file: str = "params.yaml", overrides: dict[str, Any] | None = None,
                  force: bool = False, stages: list[str] | None = None) -> dict[str, str]:
    """Run the DAG in dvc.yaml order (or only ``stages``), each stage a named subflow run.

    Without overrides it is ``dvc repro``: stages DVC considers current are skipped and each one run is
    ``dvc commit``ted, so ``dvc.lock`` stays consistent. Overrides never touch params.yaml (a DVC experiment is
    ``dvc exp run -S``): an overridden run writes its own outputs, data and metrics, to
    ``DATA_DIR/prefect/<flow run name>/`` where DVC does not look, reading the unchanged outputs of upstream
    stages it does not run from ``data/`` (:mod:`pipeline.orchestration.flow_workspace`). A run that cannot be made (a
    bad param, an unknown stage, an upstream the overrides change) ends Failed with one line, having created nothing.
    """
    from prefect.states import Failed

    from pipeline.core.suggest import did_you_mean
    from pipeline.orchestration.flow_workspace import Refused

    logger = get_run_logger()

    def refuse(message: str) -> Any:  # one line, nothing created, the run Failed (no traceback: not a bug)
        logger.error("curio: %s", message)
        return Failed(message=message)

    try:
        params = _params(params_file, overrides)  # validate before anything runs
    except CurioError as e:
        return refuse(str(e).strip().splitlines()[0])
    order = dag_order()
    for name in stages or []:
        if name not in order:
            return refuse(f"unknown stage {name!r}{did_you_mean(name, order)}; known: {', '.join(order)}")
    tracked = not overrides
    if not tracked:
        try:
            params, overrides = _workspace(params_file, params, overrides, order, stages)
        except Refused as e:
            return refuse(str(e))
    summary: dict[str, str] = {}
    with pipeline_run("pipeline", experiment=params.tracking.experiment, enabled=params.tracking.enabled,
                      artifact_root=params.tracking.artifact_root, uri=params.tracking.uri):
        for name in order:
            if stages and name not in stages:
                continue
            ran = _run_in_pipeline(name, params_file, overrides, params, tracked, force)
            if not isinstance(ran, str):  # the state the run ends with (a stop)
                return ran
            summary[name] = ran
    _publish(summary, params)
    return summary


def _workspace(params_file: str, params: Params, overrides: dict[str, Any], order: list[str],
               stages: list[str] | None) -> tuple[Params, dict[str, Any]]:
    """An overridden run's params and overrides, its outputs under ``DATA_DIR/prefect/<flow run name>/`` (created
    here); ``Refused`` (nothing created) when the overrides change an upstream it does not run."""
    from prefect.runtime import flow_run

    from pipeline.orchestration.flow_workspace import describe, plan, warning, workspace_overrides
    from pipeline.params_check import NAME as PARAMS_CHECK

    logger = get_run_logger()
    root = Path(params.data_dir) / "prefect" / (flow_run.get_name() or "run")
    asked, overrides = params, workspace_overrides(overrides, root)
    params = _params(params_file, overrides)
    selected = [n for n in order if n in stages] if stages else [n for n in order if n != PARAMS_CHECK]
    workspace = plan(_params(params_file, None), asked, selected, root)
    workspace.create()
    logger.info("overrides: %s (params.yaml and dvc.lock untouched)", describe(workspace))
    if (unread := warning(workspace, selected)) is not None:
        logger.warning("%s", unread)
    return params, overrides


def _run_in_pipeline(name: str, params_file: str, overrides: dict[str, Any] | None, params: Params, tracked: bool,
                     force: bool) -> Any:
    """One stage of the pipeline flow: what the summary says of it ("up to date", "ran", "checked"), or the state
    the run ends with when it stopped (SIGTERM)."""
    from pipeline.params_check import NAME as PARAMS_CHECK
    from pipeline.params_check import check as check_params

    logger = get_run_logger()
    if interrupt.requested() is not None:  # SIGTERM came as the last stage finished: no stage after it
        with interrupt.at(f"stage {name}"):
            return Cancelled(message=interrupt.message())
    if tracked and not force and dvcrepo.current(name):
        logger.info("%s: up to date", name)
        return "up to date"
    if name == PARAMS_CHECK:  # its stamp is DVC's: an overridden run's params were checked above
        if tracked:
            check_params(params_file)
            dvcrepo.commit([name])
        return "ran" if tracked else "checked"
    logger.info("%s: running", name)
    sub = report_flow if name == "report" else STAGE_FLOWS[name]
    state = sub.with_options(flow_run_name=f"{name} seed={params.seed}")(
        params_file=params_file, overrides=overrides, return_state=True)
    if state.is_cancelled():  # the stage stopped on SIGTERM, saying where it resumes: so does the run
        return state
    state.result()  # a failed stage raises its error here
    if tracked:
        dvcrepo.commit([name])  # dvc.lock records it as dvc repro would
    return "ran"


@task(task_run_name="evaluate {checkpoint} {split} seed={seed}", cache_policy=NO_CACHE)
def _evaluate_cell(params_file: str, checkpoint: str, split: str, seed: int, k: int, temperature: float,
                   groups: list[str], overrides: dict[str, Any] | None = None,
                   torch_threads: int | None = None) -> list[dict]:
    """One checkpoint × split × seed: every group played in one batch; a row per group plus one for all.
    ``torch_threads``: set in a Dask / Ray worker process (one core each)."""
    from stages.evaluate_text import evaluate_policy  # already imported by the flow, before the threads start

    if torch_threads is not None:
        import torch

        torch.set_num_threads(torch_threads)

    params = _params(params_file, overrides)
    rows = evaluate_policy(params, checkpoint, split, seed, k, temperature, groups=groups)
    cell = {"checkpoint": checkpoint, "split": split, "seed": seed}
    per_group = [{**cell, "group": g, **summarize([r for r in rows if r["group"] == g])} for g in groups]
    return [*per_group, {**cell, "group": "all", **summarize(rows)}] if len(groups) > 1 else per_group


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    import statistics

    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def aggregate_over_seeds(rows: list[dict]) -> list[dict]:
    """One row per (checkpoint, split, group), in first-seen order: mean and std over seeds."""
    cells: dict[tuple[str, str, str], list[dict]] = {}
    for r in rows:
        cells.setdefault((r["checkpoint"], r["split"], r["group"]), []).append(r)
    out = []
    for (checkpoint, split, group), rs in cells.items():
        agg = {"checkpoint": checkpoint, "split": split, "group": group, "seeds": len(rs),
               "episodes": sum(r["episodes"] for r in rs)}
        for key in ("success_rate", "mean_turns", "invalid_rate"):
            agg[key], agg[f"{key}_std"] = _mean_std([r[key] for r in rs])
        out.append(agg)
    return out


def results_markdown(rows: list[dict]) -> str:
    """Per (checkpoint, split, group): mean ± sample std over seeds; then every seed's row."""
    head = ("| checkpoint | split | group | seeds | episodes | success rate | mean turns | invalid rate |\n"
            "|---|---|---|---|---|---|---|---|")
    lines = [
        f"| {a['checkpoint']} | {a['split']} | {a['group']} | {a['seeds']} | {a['episodes']} | "
        f"{a['success_rate']:.3f} ± {a['success_rate_std']:.3f} | {a['mean_turns']:.2f} ± {a['mean_turns_std']:.2f} | "
        f"{a['invalid_rate']:.3f} ± {a['invalid_rate_std']:.3f} |"
        for a in aggregate_over_seeds(rows)
    ]
    seed_head = ("| checkpoint | split | group | seed | episodes | success rate | mean turns | invalid rate |\n"
                 "|---|---|---|---|---|---|---|---|")
    seed_lines = [
        f"| {r['checkpoint']} | {r['split']} | {r['group']} | {r['seed']} | {r['episodes']} | "
        f"{r['success_rate']:.3f} | {r['mean_turns']:.2f} | {r['invalid_rate']:.3f} |"
        for r in rows
    ]
    return "\n".join(["Mean ± std over seeds:", "", head, *lines, "", "Per seed:", "", seed_head, *seed_lines]) + "\n"


def plot_sweep(rows: list[dict], out: Path) -> list[Path]:
    """``success.png`` and ``mean_turns.png``: bars per checkpoint, one per group, error bars = std over seeds
    (one panel per split)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agg = aggregate_over_seeds(rows)
    splits = list(dict.fromkeys(a["split"] for a in agg))
    checkpoints = list(dict.fromkeys(a["checkpoint"] for a in agg))
    groups = list(dict.fromkeys(a["group"] for a in agg))
    width = 0.8 / len(groups)
    written = []
    for key, label in (("success_rate", "success rate"), ("mean_turns", "mean turns (successes)")):
        panel = max(5.0, 1.0 + 0.45 * len(checkpoints) * len(groups))
        fig, axes = plt.subplots(1, len(splits), figsize=(panel * len(splits), 3.6), squeeze=False)
        for ax, split in zip(axes[0], splits, strict=True):
            for j, g in enumerate(groups):
                cells = {a["checkpoint"]: a for a in agg if a["split"] == split and a["group"] == g}
                xs = [i + (j - (len(groups) - 1) / 2) * width for i, c in enumerate(checkpoints) if c in cells]
                present = [c for c in checkpoints if c in cells]
                ax.bar(xs, [cells[c][key] for c in present], width, yerr=[cells[c][f"{key}_std"] for c in present],
                       capsize=3, label=g)
            ax.set_xticks(range(len(checkpoints)), checkpoints, rotation=20, ha="right")
            ax.set_title(f"{split} split")
            ax.set_ylabel(label)
            if key == "success_rate":
                ax.set_ylim(0, 1.05)
            ax.grid(axis="y", alpha=0.3)
        axes[0][-1].legend(fontsize=8, title="group", loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        path = out / ("success.png" if key == "success_rate" else "mean_turns.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


@flow(name="eval-sweep", log_prints=True)
def eval_sweep_flow(params_file: str = "params.yaml", checkpoints: list[str] | None = None,
                    splits: list[str] | None = None, seeds: list[int] | None = None,
                    trajectories_per_task: int | None = None, out_dir: str | None = None,
                    groups: list[str] | None = None, overrides: dict[str, Any] | None = None) -> list[dict]:
    """Evaluate checkpoints × splits × seeds as parallel tasks, each over every group (default: the evaluation
    groups, ``games.eval_groups`` or ``games.groups``); results.{parquet,json} hold a row per checkpoint × split
    × group × seed, results.md the mean ± std over seeds per group, success.png / mean_turns.png the same as
    bars with error bars."""
    import stages.evaluate_text  # noqa: F401 - import the model stack once, in this thread, before fanning out

    params = _params(params_file, overrides)
    cfg = params.eval_sweep
    k = trajectories_per_task or params.evaluate_text.trajectories_per_task
    groups = list(groups or cfg.groups or eval_groups(params.games))
    cells = [(c, s, seed) for c in checkpoints or cfg.checkpoints for s in splits or cfg.splits
             for seed in seeds or cfg.seeds]
    # params.runner picks where the cells run: eval_sweep.max_workers threads here, or Dask / Ray workers
    with started(params.runner, local_workers=cfg.max_workers) as runner:
        futures = [runner.submit(_evaluate_cell, parameters={
            "params_file": str(Path(params_file).resolve()), "checkpoint": c, "split": s, "seed": seed, "k": k,
            "temperature": params.evaluate_text.temperature, "groups": groups, "overrides": overrides,
            "torch_threads": params.runner.torch_threads if params.runner.kind != "local" else None})
            for c, s, seed in cells]
        rows = [row for f in futures for row in f.result()]
    out = Path(out_dir) if out_dir else params.data_path("eval_sweep")
    out.mkdir(parents=True, exist_ok=True)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), out / "results.parquet")
    atomic_write_bytes(out / "results.md", results_markdown(rows).encode())
    atomic_write_json(out / "results.json", rows)
    plots = plot_sweep(rows, out)
    print(results_markdown(rows))
    _publish_sweep(rows, out, plots)
    return rows


def _publish_sweep(rows: list[dict], out: Path, plots: list[Path]) -> None:
    """The sweep as Prefect artifacts: a table (mean ± std over seeds) and the markdown with links to the files."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    from pipeline.orchestration.artifact_links import files_markdown

    table = [{k: round(v, 4) if isinstance(v, float) else v for k, v in a.items()} for a in aggregate_over_seeds(rows)]
    create_table_artifact(table, key="eval-sweep-table", description="mean and std over seeds per cell")
    links = files_markdown([*plots, out / "results.parquet"], out.parent)
    create_markdown_artifact(results_markdown(rows) + "\nFiles:\n\n" + links, key="eval-sweep-results",
                             description=f"results in {out.resolve()}")


def serve(limit: int | None = None) -> None:
    """Serve the ``pipeline`` and ``eval-sweep`` deployments (polls the Prefect API until interrupted)."""
    from prefect import serve as prefect_serve

    prefect_serve(
        pipeline_flow.to_deployment(name="default", description="the whole DAG, dvc.lock kept consistent"),
        eval_sweep_flow.to_deployment(name="default", description="checkpoints × splits × groups × seeds"),
        limit=limit,
    )
