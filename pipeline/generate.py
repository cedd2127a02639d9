"""``curio generate``: the files derived from the declarations, so each fact is written once.

- ``dvc.yaml`` from every stage's ``STAGE`` declaration (:class:`pipeline.core.stage.Stage`): deps, params, outs,
  metrics, plots, in dependency order.
- ``pipeline/core/registry.py``: stage name -> module, so the CLI lists stages without importing them all.
- ``docs/params.md``: the reference of every key, its default and its help string, from the same schema.
- ``docs/metrics.md``: every metric each stage writes, with its meaning, from the same declarations.
- ``docs/cli.md``: every ``curio`` command, argument and option with its help, from the command's own parser.
- ``params.yaml`` from the pydantic schema (:mod:`pipeline.core.config`): every key with its help string, the values
  an existing params.yaml holds (``--defaults``: the schema's). The schema is the one source of defaults: it
  travels with the package (a params.yaml that leaves a key out gets the same value), sits next to each key's
  type, bounds and help, and a stage's slice is cut from it; the repo's params.yaml holds the defaults.

``curio generate --check`` writes nothing and fails (exit 1) naming the files that are out of date.
"""

from __future__ import annotations

import importlib
import pkgutil
import textwrap
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

import stages as stage_package
from pipeline.core.stage import COMMON_METRIC_HELP, PARAMS_CHECK, Out, Plot, Stage, dag_order
from pipeline.llm.config import LLMConfig
from pipeline.params import Params

WIDTH = 120
TRACK_TITLES = {"params": "params check", "text": "text track", "nethack": "nethack track",
                "summary": "summary and report"}


def scalar(value: Any) -> str:
    """One YAML value in flow style (``0.003``, ``null``, ``[a, b]``, ``{x: 1}``)."""
    return yaml.safe_dump([value], default_flow_style=True, sort_keys=False, width=10**6).strip()[1:-1]


def key(text: str) -> str:
    """A mapping key, quoted only when YAML would read it as something else."""
    plain = ": " not in text and " #" not in text and not text.startswith(("-", "[", "{", "&", "*", "!", "'", '"'))
    return text if plain and yaml.safe_load(f"{text}: 1") == {text: 1} else scalar(text)


def commented(line: str, note: str, column: int = 0) -> str:
    return f"{line.ljust(column)}  # {note}" if note else line


# -- dvc.yaml -------------------------------------------------------------------------------------------------
def _out_lines(out: Out | Plot, indent: str) -> list[str]:
    opts: dict[str, Any] = {}
    if isinstance(out, Out):
        opts = {"persist": True} if out.persist else {}
        opts |= {"cache": False} if not out.cache else {}
    else:
        opts = {"cache": False, **{k: getattr(out, k) for k in ("x", "y", "template") if getattr(out, k)}}
    if not opts:
        return [commented(f"{indent}- {out.path}", out.note)]
    return [commented(f"{indent}- {out.path}:", out.note),
            *(f"{indent}    {k}: {scalar(v)}" for k, v in opts.items())]


def stage_lines(stage: Stage) -> list[str]:
    lines = [f"# {line}" for text in [stage.doc] if text for line in textwrap.wrap(text, WIDTH - 6)]
    lines = [f"  {line}" for line in lines] + [f"  {stage.name}:", f"    cmd: {stage.command}"]
    deps = stage.deps()
    if deps:
        lines += ["    deps:", *(commented(f"      - {d}", stage.notes.get(d, "")) for d in deps)]
    if stage.params:
        lines += ["    params:", *(f"      - {p}" for p in stage.params)]
    if stage.metrics:
        lines += ["    metrics:", *(line for m in stage.metrics for line in _out_lines(m, "      "))]
    lines += ["    outs:", *(line for o in stage.all_outs() for line in _out_lines(o, "      "))]
    in_stage = [p for p in stage.plots if p.in_stage]
    if in_stage:
        lines += ["    plots:", *(line for p in in_stage for line in _out_lines(p, "      "))]
    return lines


def plot_lines(stages: list[Stage]) -> list[str]:
    lines = []
    for plot in (p for s in stages for p in s.plots if not p.in_stage):
        if plot.title is None:
            lines.append(f"  - {plot.path}")
            continue
        lines.append(f"  - {key(plot.title)}:")
        lines += [f"      template: {plot.template}"] if plot.template else []
        lines += [f"      x: {plot.x}", "      y:", f"        {plot.path}: {plot.y}"]
    return lines


def declared_stages() -> list[Stage]:
    """Every STAGE declared by a module under ``stages/``, in DAG order."""
    found = []
    names = [m.name for m in pkgutil.walk_packages(stage_package.__path__, "stages.")]
    for module_name in names:
        stage = getattr(importlib.import_module(module_name), "STAGE", None)
        if isinstance(stage, Stage) and stage.module == module_name:  # not one imported from another module
            found.append(stage)
    return dag_order(found)


def render_dvc_yaml(stages: list[Stage]) -> str:
    lines = [
        "# Generated by `curio generate` from the STAGE declarations in stages/ (pipeline/core/stage.py): edit",
        "# those and regenerate; a test fails when this file is out of date. Each stage declares exactly the params",
        "# it reads, and resumable outputs are `persist: true` so DVC keeps finished parts across a rerun.",
        "stages:",
    ]
    track = None
    for stage in stages:
        if stage.track != track:
            track = stage.track
            lines += [f"  # --- {TRACK_TITLES.get(track, track)} ".ljust(WIDTH - 10, "-")]
        lines += [*stage_lines(stage), ""]
    lines += ["# What `dvc plots show` / `dvc plots diff` draw (and the report's learning curves): each stage's",
              "# declared plots.", "plots:", *plot_lines(stages)]
    return "\n".join(lines) + "\n"


# -- pipeline/core/registry.py --------------------------------------------------------------------------------------
def render_registry(stages: list[Stage]) -> str:
    rows = "\n".join(f"    {s.name!r}: {s.module!r}," for s in stages if not s.cmd)
    outs = "\n".join(f"    {o.path.removeprefix('data/')!r}: {s.name!r},"
                     for s in stages if not s.cmd for o in s.outs if o.path.startswith("data/"))
    return ('"""Generated by `curio generate` from the STAGE declarations in stages/: do not edit.\n\n'
            "Stage name -> the module that declares and runs it (``curio stage NAME``), in DAG order, so the CLI\n"
            "lists the stages without importing them; and each output under data/ -> the stage that writes it, so\n"
            'a missing or corrupt input names the stage to run."""\n\n'
            f"STAGES: dict[str, str] = {{\n{rows.replace(chr(39), chr(34))}\n}}\n\n"
            f"OUTS: dict[str, str] = {{\n{outs.replace(chr(39), chr(34))}\n}}\n")


# -- params.yaml -----------------------------------------------------------------------------------------------
def _shown(model: BaseModel) -> dict[str, Any]:
    """The fields params.yaml lists: all of them, but only what differs from the defaults of an LLM role
    (backend and model always), so a role reads as what it is rather than 17 lines of defaults."""
    if not isinstance(model, LLMConfig):
        return {name: getattr(model, name) for name in type(model).model_fields}
    base = LLMConfig().model_dump()
    return {k: getattr(model, k) for k, v in model.model_dump().items() if k in ("backend", "model") or v != base[k]}


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_defaults=True)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _model_lines(model: BaseModel, indent: str) -> list[str]:
    lines: list[str] = []
    fields = type(model).model_fields
    for name, value in _shown(model).items():
        # an LLM role's own help says what it is; its fields' help would repeat on every role
        help_text = "" if isinstance(model, LLMConfig) else (fields[name].description or "").replace("\n", " ")
        if isinstance(value, BaseModel):
            lines += _comment_above(indent, help_text) + [f"{indent}{name}:"] + _model_lines(value, indent + "  ")
            continue
        if isinstance(value, dict) and value and all(isinstance(v, BaseModel) for v in value.values()):
            lines += _comment_above(indent, help_text) + [f"{indent}{name}:"]
            lines += [f"{indent}  {k}: {scalar(_plain(v))}" for k, v in value.items()]
            continue
        lines += _value_lines(name, value, help_text, indent)
    return lines


def _value_lines(name: str, value: Any, help_text: str, indent: str) -> list[str]:
    line = f"{indent}{name}: {scalar(_plain(value))}"
    column = max(len(line), 28)
    if help_text and column + 4 + len(help_text) <= WIDTH:
        return [commented(line, help_text, column)]
    return [*_comment_above(indent, help_text), line]


def _comment_above(indent: str, text: str) -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(text, WIDTH - len(indent) - 2)] if text else []


def render_params_yaml(params: Params | None = None) -> str:
    """Every key of the schema with its help string; the values of ``params`` (default: the defaults)."""
    params = params or Params()
    lines = [
        "# Curio's params: the whole DAG on a laptop CPU, no downloads. Generated by `curio generate` from the",
        "# params schema (pipeline/params.py, composed of the sections beside the code that reads them: the",
        "# config.py of pipeline/text, nethack, llm, models and core), the one source of defaults and help strings",
        "# (the repo's file holds the defaults: change one there and run `curio generate --defaults`). Override with",
        "# `dvc exp run -S key=value` or `curio stage NAME -S key=value`.",
    ]
    fields = Params.model_fields
    for name in fields:
        value, help_text = getattr(params, name), fields[name].description or ""
        if isinstance(value, BaseModel):
            lines += ["", *_comment_above("", help_text), f"{name}:", *_model_lines(value, "  ")]
        else:
            lines += _value_lines(name, value, help_text, "")
    return "\n".join(lines) + "\n"


# -- docs/params.md --------------------------------------------------------------------------------------------
def _cell(text: str) -> str:
    """Text for a table cell: pipes escaped, and outside code spans ``<`` and ``>`` (``<Answer>`` is no HTML tag)."""
    parts = text.replace("|", "\\|").replace("\n", " ").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def _value_cell(value: Any) -> str:
    shown = scalar(_plain(value)) if not isinstance(value, LLMConfig) else scalar(
        {k: _plain(v) for k, v in _shown(value).items()})
    return f"`{_cell(shown)}`" if shown else ""


def _rows(model: BaseModel, prefix: str) -> list[str]:
    """One table row per key under ``model`` (nested sections as dotted keys; an LLM role as one row)."""
    rows = []
    for name, field in type(model).model_fields.items():
        value, key = getattr(model, name), f"{prefix}{name}"
        help_text = _cell(field.description or "")
        if isinstance(value, BaseModel) and not isinstance(value, LLMConfig):
            rows += [f"| `{key}` | | {help_text} |"] if help_text else []
            rows += _rows(value, f"{key}.")
            continue
        if isinstance(value, LLMConfig):
            help_text += (" " if help_text else "") + "(an [LLM role](#an-llm-role))"
        rows.append(f"| `{key}` | {_value_cell(value)} | {help_text} |")
    return rows


def _readers(stages: list[Stage], name: str) -> list[str]:
    """The stages whose declared params take in section ``name`` (or a key of it); check-params reads them all."""
    return [s.name for s in stages if s.name != PARAMS_CHECK
            and any(p == name or p.startswith(f"{name}.") for p in s.params)]


def render_params_md(stages: list[Stage]) -> str:
    """docs/params.md: every key of the schema with its default and help string, a section per top-level key."""
    params, header = Params(), "| key | default | what it does |\n|---|---|---|"
    lines = ["# Params reference", "",
             "Generated by `curio generate` from the params schema (`pipeline/params.py` and the `config.py` of each "
             "layer it composes): every key of `params.yaml`, its default and what it does. `curio generate --check` "
             "fails while this page is out of date. Override a key with `dvc exp run -S key=value` or `curio stage "
             "NAME -S key=value`; a preset sets several at once ([recipes.md](recipes.md#one-preset-per-published-"
             "system)). A bad key or value is one line naming it, exit code 2.", ""]
    top = [n for n, f in Params.model_fields.items() if not isinstance(getattr(params, n), BaseModel)]
    lines += ["## Shared keys", "", "Every stage reads these (check-params reads every key).", "", header,
              *(f"| `{n}` | {_value_cell(getattr(params, n))} | {_cell(Params.model_fields[n].description or '')} |"
                for n in top), ""]
    for name, field in Params.model_fields.items():
        value = getattr(params, name)
        if name in top:
            continue
        readers, about = _readers(stages, name), _cell(field.description or "")
        read = (f"Stages that read it: {', '.join(readers)}." if readers else
                "No stage declares it: the machinery every stage runs in, and the `curio` commands, read it.")
        lines += [f"## {name}", "", f"{about[:1].upper()}{about[1:]}. {read}", "", header]
        lines += [*_rows(value, f"{name}."), ""]
    lines += ["## An LLM role", "",
              "Every key that names an LLM role (a judge, the environment, an annotator) takes these; "
              "the default column above gives what differs from them.", "", header,
              *_rows(LLMConfig(), ""), ""]
    return "\n".join(lines)


# -- docs/metrics.md ------------------------------------------------------------------------------------------
def render_metrics_md(stages: list[Stage]) -> str:
    """docs/metrics.md: every metric each stage declares (:attr:`Stage.metric_help`) with its meaning, and the
    summaries ``dvc metrics show`` prints."""
    header = "| metric | what it means |\n|---|---|"
    lines = ["# Metrics reference", "",
             "Generated by `curio generate` from each stage's declaration (`metric_help` beside `STAGE` in "
             "`stages/NAME.py`; the metrics several stages share are declared once, beside the code that computes "
             "them). `curio generate --check` fails while this page is out of date, and a test fails when a stage "
             "writes a metric it does not declare.", "",
             "Each stage writes its metrics to `metrics/stages/STAGE.json` (git-tracked: `git diff` compares two "
             "runs by them; `dvc metrics show` prints only the summaries below) and logs the numbers as the metrics "
             "of its MLflow run (`curio stage NAME` prints them too). A key may "
             "stand for several: `{policy}` is a text policy's name (`base`, `sft`, `dpo`, `rl`) or a NetHack agent's, "
             "`{group}` a task group, "
             "`{variant}` an `rl_nethack.variants` name, and so on. A metric that only some params produce says which "
             "(`archer:`, `multiturn:`, `reward motif:`). Training stages also log curves to MLflow, step by step: "
             "every value TRL's trainer logs, under the phase's prefix (`bootstrap/loss`, `sft/learning_rate`, "
             "`dpo/rewards/margins`, ...; TRL's documentation lists them), the reward models' losses and agreement "
             "per epoch, and rl-text's per-round values.", ""]
    summaries = [(s, m) for s in stages for m in s.metrics]
    if summaries:
        lines += ["## What `dvc metrics show` prints", "",
                  "The files dvc.yaml declares as metrics, written by the report stage from the stages' metrics:", "",
                  "| file | what it holds |", "|---|---|",
                  *(f"| `{m.path}` | {_cell(m.note)} |" for _, m in summaries), ""]
    for stage in stages:
        if stage.cmd:  # no metrics file of its own (check-params, report)
            continue
        declared = {**stage.metric_help, **COMMON_METRIC_HELP}
        lines += [f"## {stage.name}", "", f"`metrics/stages/{stage.name}.json`", "", header,
                  *(f"| `{key}` | {_cell(text)} |" for key, text in declared.items()), ""]
    return "\n".join(lines)


# -- docs/cli.md ----------------------------------------------------------------------------------------------
def _first_sentence(text: str) -> str:
    """The first sentence of a help text: up to the first full stop outside brackets (``e.g.`` inside them)."""
    flat, depth = " ".join(text.split()), 0
    for i, ch in enumerate(flat):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(ch, 0)
        if ch == "." and depth == 0 and (i + 1 == len(flat) or flat[i + 1] == " "):
            return flat[:i + 1]
    return flat


def _subcommands(command: Any, ctx: Any, name: str) -> list[tuple[str, Any, Any]]:
    """Every command under a Click ``command`` (a group's after its own), as (full name, command, its context).
    Duck-typed: Typer builds its commands on the Click it bundles, not on the installed one."""
    found = [(name, command, ctx)]
    for sub in command.list_commands(ctx) if hasattr(command, "list_commands") else []:
        child = command.get_command(ctx, sub)
        if child is not None and not child.hidden:
            found += _subcommands(child, child.context_class(child, info_name=sub, parent=ctx), f"{name} {sub}")
    return found


def _anchor(name: str) -> str:
    return "#" + name.replace(" ", "-")


def render_cli_md(command: Any) -> str:
    """docs/cli.md: every command of the ``curio`` parser (a Click command, as Typer builds it) with its help, usage,
    arguments and options, as ``curio COMMAND --help`` prints them, and the exit codes (the parser's epilog)."""
    found = _subcommands(command, command.context_class(command, info_name="curio"), "curio")
    runnable = [(n, c, x) for n, c, x in found if not hasattr(c, "list_commands")]
    lines = ["# Command reference", "",
             "Generated by `curio generate` from the `curio` command's own parser (`pipeline/cli.py`): every command, "
             "argument and option with its help, as `curio COMMAND --help` prints them. `curio generate --check` fails "
             "while this page is out of date. Every command also takes `--help`. The params a command takes with "
             "`-S key=value`: [params.md](params.md).", "",
             " ".join((command.help or "").split()), "", "| command | what it does |", "|---|---|",
             *(f"| [`{n}`]({_anchor(n)}) | {_cell(_first_sentence(c.help or ''))} |" for n, c, _ in runnable), ""]
    if command.epilog:
        lines += [" ".join(command.epilog.split()), ""]
    for name, cmd, ctx in runnable:
        body = [" ".join(p.split()) for p in (cmd.help or "").split("\n\n")]
        lines += [f"## `{name}`", "", *(line for p in body for line in (p, "")), "```",
                  " ".join([name, *cmd.collect_usage_pieces(ctx)]), "```", ""]
        records = [r for p in cmd.get_params(ctx) if p.name != "help" and (r := p.get_help_record(ctx)) is not None]
        if records:
            lines += ["| argument or option | what it does |", "|---|---|",
                      *(f"| `{names}` | {_cell(' '.join(text.split()))} |" for names, text in records), ""]
    return "\n".join(lines)


# -- the command ------------------------------------------------------------------------------------------------
def current_params(path: Path) -> Params | None:
    """The values of an existing params.yaml (schema-checked only), or None when there is none usable."""
    try:
        return Params.model_validate(yaml.safe_load(path.read_text()) or {})
    except (OSError, yaml.YAMLError, ValueError):
        return None


def outputs(root: Path = Path("."), defaults: bool = False, cli: Any = None) -> dict[Path, str]:
    """Each generated file and what it should hold; docs/cli.md when given the ``curio`` parser (``cli``:
    :func:`pipeline.cli.parser`, which imports this module, so it is passed in)."""
    stages = declared_stages()
    values = None if defaults else current_params(root / "params.yaml")
    return {root / "dvc.yaml": render_dvc_yaml(stages),
            root / "pipeline" / "core" / "registry.py": render_registry(stages),
            root / "params.yaml": render_params_yaml(values),
            root / "docs" / "params.md": render_params_md(stages),
            root / "docs" / "metrics.md": render_metrics_md(stages),
            **({root / "docs" / "cli.md": render_cli_md(cli)} if cli is not None else {})}


def _comments(text: str) -> list[str]:
    """The text of every comment, in order, whitespace collapsed (where a line break puts it does not count)."""
    found = []
    for line in text.splitlines():
        comment = _comment(line)
        if comment is not None:
            found.append(" ".join(comment.split()))
    return found


def _comment(line: str) -> str | None:
    """A line's comment: after the first ``#`` (at the start or after a space) before which the line reads the
    same as with it, so a ``#`` inside a quoted value is not one."""
    def load(part: str) -> object:
        try:
            return yaml.safe_load(part)
        except yaml.YAMLError:
            return ValueError
    whole = None
    for i, ch in enumerate(line):
        if ch == "#" and (i == 0 or line[i - 1].isspace()):
            if not line[:i].strip():
                return line[i + 1:]
            whole = load(line) if whole is None else whole
            if whole is not ValueError and load(line[:i]) == whole:
                return line[i + 1:]
    return None


def same_params(text: str, expected: str) -> bool:
    """Whether a params.yaml says what the generated one says: the same keys in the same order, the same values,
    the same help comments, however it is laid out. ``dvc exp run -S`` rewrites the file with ruamel.yaml (nulls
    left blank, flow lists as blocks, a comment above a key sometimes moved to the line before), and its experiment
    commits carry that file: it is not out of date for that."""
    try:
        mine, theirs = yaml.safe_load(text), yaml.safe_load(expected)
    except yaml.YAMLError:
        return False
    return _same(mine, theirs) and _comments(text) == _comments(expected)


def _same(a: object, b: object) -> bool:
    """Equal values, mappings with their keys in the same order (``2`` and ``2.0`` are the same number)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b or (isinstance(a, int | float) and isinstance(b, int | float)
                                             and not isinstance(a, bool) and not isinstance(b, bool) and a == b)


def generate(root: Path = Path("."), check: bool = False, defaults: bool = False, cli: Any = None) -> list[Path]:
    """Write the generated files (or, with ``check``, write nothing); the paths that were out of date.

    params.yaml keeps the values it holds (an experiment's baseline is the user's), in the schema's shape, with its
    help; ``defaults`` resets every value to the schema's default. ``check`` compares params.yaml by what it says
    (:func:`same_params`), not byte for byte."""
    stale = []
    for path, text in outputs(root, defaults, cli).items():
        if check and path == root / "params.yaml" and path.exists() and same_params(path.read_text(), text):
            continue
        if not path.exists() or path.read_text() != text:
            stale.append(path)
            if not check:
                path.write_text(text)
    return stale
