"""params.yaml's machinery: load, override, validate, and a stage's slice of the params.

Every section is a strict pydantic model (unknown keys are errors), kept beside what uses it: the LLM roles in
``pipeline/llm/config.py``, training in ``pipeline/models/config.py``, each track's stages in
``pipeline/text/config.py`` and ``pipeline/nethack/config.py``; here, only the machinery's own (tracking, runner).
:class:`pipeline.params.Params` composes them into the whole file and registers itself with :func:`set_schema`.
A bad value surfaces as one line naming the key (``ConfigError``); the CLI turns it into exit code 2 before
anything is written. The defaults and help strings of the sections are the only ones: ``curio generate`` writes
params.yaml from them, and a stage's params slice (``slice_model``) is cut from them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from pipeline.core.artifacts import stable_hash
from pipeline.core.errors import CurioError
from pipeline.core.suggest import unknown_key_hint


class ConfigError(ValueError, CurioError):
    """A params.yaml problem, phrased as one line naming the key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TrackingConfig(Section):
    experiment: str = Field("curio", description="MLflow experiment name")
    enabled: bool = Field(True, description="log every stage to MLflow")
    artifact_root: str = Field("mlartifacts", description="artifact directory of the default SQLite store, relative "
                               "to the checkout a command runs in (a copy never writes into another clone)")
    uri: str | None = Field(None, description="MLflow tracking URI, e.g. an `mlflow server` (http://HOST:5000), "
                            "which also stores the artifacts; null = $MLFLOW_TRACKING_URI, else ./mlflow.db")


class RunnerConfig(Section):
    """Where chunked stages (rollout-text, annotate-*, reflogprobs, evaluate-*) and the eval-sweep fan out:
    a Prefect task runner, and how long a stage may take to stop on a signal. Not a stage param: a runner changes
    where chunks run and when a stage stops, never their rows."""

    kind: Literal["local", "dask", "ray"] = Field(
        "local", description="local: this process (eval-sweep: eval_sweep.max_workers threads); dask: prefect-dask "
        "on a `distributed` cluster; ray: prefect-ray on a Ray cluster")
    address: str | None = Field(
        None, description="dask: scheduler address (tcp://HOST:8786); ray: cluster address (HOST:6379, "
        "ray://HOST:10001 or auto); null = start a local cluster of `workers` processes for the run")
    workers: int = Field(2, ge=1, description="worker processes of a local dask / ray cluster")
    torch_threads: int = Field(1, ge=1, description="torch threads per worker process (1: one core each)")
    grace_s: float = Field(
        20.0, gt=0, le=3600, description="on SIGTERM / SIGINT a stage saves its progress (a chunk, a training step, "
        "a round, a sample-factory checkpoint) and exits 143 (130) within this many seconds, saying where it "
        "resumes; work in flight a third of it before the end is dropped (docs/reliability.md)")


# -- the whole file ----------------------------------------------------------------------------------------
#: The two keys every stage gets (:data:`SHARED_KEYS`), on the whole params and on each stage's slice.
DATA_DIR = Field("data", description="root of stage outputs (relative to the repo)")
METRICS_DIR = Field(None, description="git-tracked metrics and plots (null: `metrics` beside data_dir, i.e. the "
                    "repo's metrics/ for the default data_dir)")
_SCHEMA: list[type[BaseModel]] = []


def set_schema(model: type[BaseModel]) -> None:
    """Register the whole params' model (:class:`pipeline.params.Params` does, when it is imported)."""
    _SCHEMA[:] = [model]


def params_schema() -> type[BaseModel]:
    """The whole params' model, which stage slices are cut from."""
    if not _SCHEMA:
        raise RuntimeError("the params schema is not loaded: import pipeline.params (entry points and stages do)")
    return _SCHEMA[0]


class Locations:
    """Where outputs go (from the ``data_dir`` and ``metrics_dir`` fields) and the params hash: on Params and on a
    stage's slice."""

    def section_hash(self, keys: list[str] | tuple[str, ...]) -> str:
        """Hash of the given top-level sections / dotted keys: a stage's params hash."""
        dump = self.model_dump(mode="json")
        picked = {k: _get_dotted(dump, k) for k in keys}
        return stable_hash(picked)

    def data_path(self, *parts: str) -> Path:
        return Path(self.data_dir).joinpath(*parts)

    def metrics_path(self, *parts: str) -> Path:
        """Under the git-tracked metrics root: ``stages/NAME.json`` per stage, ``TRACK_SECTION.json`` summaries."""
        root = Path(self.metrics_dir) if self.metrics_dir else Path(self.data_dir).parent / "metrics"
        return root.joinpath(*parts)

    def plots_path(self, *parts: str) -> Path:
        """Under the git-tracked plots directory (``dvc plots show`` / ``dvc plots diff`` read it)."""
        return self.metrics_path("plots", *parts)


# -- a stage's slice of the params -------------------------------------------------------------------------
#: What every stage gets besides the keys it declares: where its outputs go. No output depends on them (the
#: same params write the same rows into any directory), so they are neither in a stage's params hash nor in
#: its dvc.yaml params; ``seed`` is not among them: a stage that draws random numbers declares it.
SHARED_KEYS = ("data_dir", "metrics_dir")


class UndeclaredParamError(AttributeError):
    """A stage read a params key its STAGE declaration does not list (DVC would not rerun it on a change)."""


class ParamsSlice(Section, Locations):
    """The part of :class:`Params` one stage declares (``Stage.params``), same shape: ``p.rollout_text.top_p``
    reads the same value; reading a key the stage did not declare raises :class:`UndeclaredParamError`."""

    data_dir: str = DATA_DIR
    metrics_dir: str | None = METRICS_DIR

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            return super().__getattr__(name)
        raise UndeclaredParamError(_undeclared(type(self), name))


class _PartialSection(Section):
    """Some fields of a params section: the declared ones (``rollout_text.top_p``), nothing else."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            return super().__getattr__(name)
        raise UndeclaredParamError(_undeclared(type(self), name))


def _undeclared(cls: type, name: str) -> str:
    key = f"{cls.__curio_path__}.{name}" if getattr(cls, "__curio_path__", "") else name
    return (f"stage {cls.__curio_stage__} reads params key {key!r}, which its STAGE declaration does not list: "
            f"add it to STAGE.params (dvc.yaml is then regenerated by `curio generate`)")


def _field_tree(keys: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Dotted keys as a tree; None = the whole value (``policy``, or ``top_p`` under ``rollout_text``)."""
    tree: dict[str, Any] = {}
    for key in sorted(keys, key=lambda k: k.count(".")):  # a whole section before keys inside it
        node: dict[str, Any] | None = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if node is None:  # the section is declared whole already
                break
        else:
            node[leaf] = None
    return tree


def slice_model(stage: str, keys: list[str] | tuple[str, ...]) -> type[ParamsSlice]:
    """The pydantic model of stage ``stage``'s params: the declared keys with their types and help strings from
    :class:`Params` (a dotted key gets a section holding only the declared fields), plus :data:`SHARED_KEYS`."""
    def build(cls: type[BaseModel], tree: dict[str, Any], path: str, base: type[BaseModel]) -> type[BaseModel]:
        fields: dict[str, Any] = {}
        for name, sub in tree.items():
            key = f"{path}.{name}" if path else name
            info = cls.model_fields.get(name)
            if info is None:
                raise KeyError(f"stage {stage}: params key {key!r} is not in the params schema "
                               "(pipeline/params.py)")
            if key in SHARED_KEYS:
                raise KeyError(f"stage {stage}: {key!r} is given to every stage; do not declare it")
            if sub is None:
                fields[name] = (info.annotation, Field(description=info.description))
                continue
            section = info.annotation
            if not (isinstance(section, type) and issubclass(section, BaseModel)):
                raise KeyError(f"stage {stage}: params key {key!r} has no sub-keys")
            fields[name] = (build(section, sub, key, _PartialSection), Field(description=info.description))
        model = create_model(f"{cls.__name__}[{stage}]", __base__=base, __doc__=cls.__doc__, **fields)
        model.__curio_stage__, model.__curio_path__ = stage, path
        return model

    return build(params_schema(), _field_tree(keys), "", ParamsSlice)


def take_slice(model: type[ParamsSlice], params: BaseModel) -> ParamsSlice:
    """``params`` cut down to ``model`` (a :func:`slice_model`): the declared values, already validated."""
    def values(cls: type[BaseModel], source: BaseModel) -> dict[str, Any]:
        out = {}
        for name, info in cls.model_fields.items():
            value = getattr(source, name)
            sub = info.annotation
            partial = isinstance(sub, type) and issubclass(sub, _PartialSection)
            out[name] = sub.model_construct(**values(sub, value)) if partial else value
        return out

    return model.model_construct(**values(model, params))


def _get_dotted(d: dict, key: str) -> Any:
    cur: Any = d
    for part in key.split("."):
        cur = cur[part]
    return cur


def _set_dotted(d: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    cur = d
    for part in parts[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[part] = nxt
        cur = nxt
    cur[parts[-1]] = value


def _format_error(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "<root>"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key" + unknown_key_hint(params_schema(), tuple(first["loc"]))
    extra = f" (and {len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    relative = re.match(r"([a-z_]\w*(?:\.\w+)*): ", msg)  # a section's validator naming a key inside it
    if relative and first["loc"]:
        loc, msg = f"{loc}.{relative.group(1)}", msg[relative.end():]
    return f"params: {loc}: {msg}{extra}"


def parse_override(text: str) -> tuple[str, Any]:
    """``key.sub=value`` with value parsed as YAML (so 3, 0.1, true, [a, b] keep their types). A leading ``+`` or
    ``++`` (DVC's way to add a key params.yaml lacks) is accepted, so ``curio preset``'s arguments serve ``curio``
    and ``dvc exp run`` alike."""
    if "=" not in text:
        raise ConfigError(f"params: override {text!r} is not key=value")
    key, raw = text.split("=", 1)
    return key.strip().lstrip("+"), yaml.safe_load(raw) if raw.strip() else ""


def dvc_set_param(override: str, raw: dict) -> str:
    """``override`` as a ``dvc exp run -S`` argument against the params file ``raw``: ``++key=value`` where the key
    is not in it (DVC refuses to set a missing key without that), the override unchanged where it is."""
    key = parse_override(override)[0]
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return "++" + override.lstrip("+")
        node = node[part]
    return override


def read_params(path: str | Path = "params.yaml", overrides: list[str] | dict[str, Any] | None = None,
                schema: type[BaseModel] | None = None) -> Any:
    """Load, apply ``key=value`` overrides and validate against the schema. Raises ConfigError (one line).
    Entry points call :func:`pipeline.params.load_params`, which adds the checks that need the games, the
    LLM backends and the NetHack prompts."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"params: {path} not found")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"params: {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if raw is None:
        raise ConfigError(f"params: {path} is empty (it must be a mapping of sections; see the repo's params.yaml)")
    if not isinstance(raw, dict):
        raise ConfigError(f"params: {path} must be a mapping of sections, not a {type(raw).__name__}")
    items = overrides.items() if isinstance(overrides, dict) else [parse_override(o) for o in overrides or []]
    for key, value in items:
        _set_dotted(raw, key, value)
    try:
        params = (schema or params_schema()).model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_error(e)) from None
    return params


def preset_overrides(*paths: str | Path) -> list[str]:
    """Presets (partial params.yaml files) as dotted ``key=value`` overrides, values in compact YAML flow style
    with no spaces, so they survive the shell as ``-S`` arguments of ``dvc exp run`` / ``curio``.

    Presets compose. A preset may name the presets it builds on, ``extends: FILE`` or ``extends: [FILE, ...]``
    (paths relative to the preset's own folder); and several presets stack left to right. Either way they merge
    as mappings: a later value replaces an earlier one key by key, and a list is replaced whole. ``remove: [KEY,
    ...]`` (dotted keys) drops what the presets it extends set there, e.g. one of their agents, so a preset can take
    a smaller part of another without copying it; params.yaml's own keys stay."""
    import json

    def flat(prefix: str, node) -> list[str]:
        if isinstance(node, dict) and node:
            return [o for k, v in node.items() for o in flat(f"{prefix}.{k}" if prefix else str(k), v)]
        return [f"{prefix}={json.dumps(node, separators=(',', ':'))}" if not isinstance(node, str)
                else f"{prefix}={node}"]

    merged: dict = {}
    for path in paths:
        _merge(merged, _load_preset(Path(path), ()))
    return flat("", merged)


def _load_preset(path: Path, chain: tuple[Path, ...]) -> dict:
    """One preset with what it ``extends`` merged under it; ``chain`` is the presets that extend it (a cycle)."""
    where = path.resolve()
    if where in chain:
        raise ConfigError(f"preset {path}: extends itself through {' -> '.join(p.name for p in (*chain, where))}")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as e:
        raise ConfigError(f"preset {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"preset {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"preset {path}: not a mapping of params")
    bases = raw.pop("extends", [])
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) and b for b in bases):
        raise ConfigError(f"preset {path}: extends must be a preset file or a list of them")
    removed = raw.pop("remove", [])
    if not isinstance(removed, list) or not all(isinstance(k, str) and k for k in removed):
        raise ConfigError(f"preset {path}: remove must be a list of dotted keys")
    merged: dict = {}
    for base in bases:
        _merge(merged, _load_preset(path.parent / base, (*chain, where)))
    for key in removed:
        if not _pop_dotted(merged, key):
            raise ConfigError(f"preset {path}: remove: {key} is not set by the presets it extends")
    return _merge(merged, raw)


def _pop_dotted(d: dict, key: str) -> bool:
    """Remove ``key`` (dotted) from ``d``, and the mappings it leaves empty; whether it was there."""
    head, _, rest = key.partition(".")
    if head not in d:
        return False
    if not rest:
        del d[head]
        return True
    if not isinstance(d[head], dict) or not _pop_dotted(d[head], rest):
        return False
    if not d[head]:
        del d[head]
    return True


def _merge(into: dict, over: dict) -> dict:
    """``over`` merged into ``into`` key by key (nested mappings merge; anything else, lists too, replaces)."""
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into
