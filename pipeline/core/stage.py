"""The stage contract: each module in ``stages/`` declares itself once, in ``STAGE = Stage(...)``, and defines
``run(params, ctx) -> StageResult``; ``execute`` is what every entry point (DVC, Prefect, ``curio stage``) calls.

The declaration is the one place that says what a stage reads (``params``: dotted keys of params.yaml), what it
depends on (``code``, ``data``) and what it writes (``outs``, ``plots``, trained ``models``). ``run`` receives
only that params slice (plus :data:`pipeline.core.config.SHARED_KEYS`), so reading an undeclared key fails loudly;
``curio generate`` writes dvc.yaml and the registry (:mod:`pipeline.core.registry`) from the declarations.
``execute`` adds what every stage shares: the MLflow run with lineage, the metrics file
``metrics/stages/NAME.json`` (git-tracked) and timing.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from pydantic import BaseModel

from pipeline.core.artifacts import (
    MANIFEST,
    atomic_write_json,
    dataset_hash,
    dir_hash,
    file_sha256,
    producing_stage,
    read_manifest,
)
from pipeline.core.cards import write_cards
from pipeline.core.config import SHARED_KEYS, ParamsSlice, slice_model, take_slice
from pipeline.core.errors import InputError
from pipeline.core.interrupt import stopping
from pipeline.core.kernels import KERNEL_KEYS, require
from pipeline.core.locks import hold
from pipeline.core.processes import use_processes
from pipeline.core.registry import STAGES
from pipeline.core.runners import use_runner
from pipeline.core.samples import log_samples
from pipeline.core.tracking import StageTracking, Tracker, git_tags

PARAMS_CHECK = "check-params"  # the DAG's first stage: every param checked before DVC removes any output
PARAMS_STAMP = "data/params.ok"  # its out, a dep of every other stage (pipeline/params_check.py)

#: ``CURIO_PARAMS_READS=FILE``: run each stage on the whole params, recording every key it reads, and append
#: ``{"stage", "declared", "reads"}`` as one JSON line to FILE (what tests/test_stage_declarations.py checks).
READS_ENV = "CURIO_PARAMS_READS"


@dataclass
class Out:
    """An output of a stage (a path relative to the repo, ``data/...`` mapped into ``data_dir``)."""

    path: str
    persist: bool = False  # DVC keeps it across a rerun, so the stage resumes from its finished parts
    cache: bool = True  # False: git-tracked (metrics/), not in DVC's cache
    note: str = ""  # a comment beside it in dvc.yaml


@dataclass
class Plot:
    """Plot data a stage writes under ``metrics/plots/`` (a git-tracked out) and how ``dvc plots show`` draws it:
    with a ``title``, a plot definition at the end of dvc.yaml; without, the file itself (an image)."""

    path: str
    title: str | None = None
    x: str | None = None
    y: str | None = None
    template: str | None = None
    in_stage: bool = False  # drawn from the stage's own ``plots:`` (a directory of CSVs), not a definition
    note: str = ""


@dataclass
class Stage:
    """One node of the DAG, declared in its module (``STAGE = Stage(...)``)."""

    name: str
    # dotted params.yaml keys run() reads: dvc.yaml params, the slice, the params hash (KERNEL_KEYS added)
    params: list[str]
    code: list[str] = field(default_factory=list)  # source deps besides the module itself (dirs allowed)
    data: list[str] = field(default_factory=list)  # data deps: other stages' outs
    outs: list[Out] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    models: list[str] = field(default_factory=list)  # trained models under data_dir: MLflow models + card
    # "module:function" loading one of ``models`` as a torch module, logged with MLflow's pytorch flavour (a
    # Hugging Face directory needs none: the transformers flavour logs it from its files)
    model_loader: str | None = None
    metrics: list[Out] = field(default_factory=list)  # dvc.yaml metrics (the report's summaries)
    # every key run() may write to metrics/stages/NAME.json (and the stage's MLflow run) -> what it means, one line;
    # ``{name}`` in a key stands for any text without a slash (``{policy}/success_rate``); docs/metrics.md is written
    # from these, and a test fails when a stage writes a key it does not declare. ``seconds``: every stage's.
    metric_help: dict[str, str] = field(default_factory=dict)
    track: str = "text"  # text | nethack | summary: groups dvc.yaml, breaks ties in its order
    doc: str = ""  # a comment above the stage in dvc.yaml
    notes: dict[str, str] = field(default_factory=dict)  # dep path -> a comment beside it in dvc.yaml
    cmd: str = ""  # default: curio stage NAME (with a metrics file metrics/stages/NAME.json)
    # the ``data`` deps a run reads, given its params slice (default: all of them): each must exist before ``run``
    # starts, else the stage fails at once naming the stage to run first (e.g. data/bootstrap is read only for the
    # built-in policy; evaluate-text reads the policies it evaluates)
    needs: Callable[[Any], list[str]] | None = None
    module: str = ""  # the module that declares it (where ``Stage(...)`` is called, unless given)

    def __post_init__(self) -> None:
        if not self.module:  # frames: __post_init__ <- the dataclass __init__ <- the declaring module
            self.module = sys._getframe(2).f_globals.get("__name__", "")
        # every stage computes with the kernels these keys pin (``execute`` sets them before the stage loads torch)
        self.params = [*self.params, *(k for k in KERNEL_KEYS if k not in self.params)]

    @property
    def command(self) -> str:
        return self.cmd or f"curio stage {self.name}"

    @cached_property
    def params_model(self) -> type[ParamsSlice]:
        """The typed params slice ``run`` receives (:func:`pipeline.core.config.slice_model`)."""
        return slice_model(self.name, self.params)

    def slice(self, params: Any) -> ParamsSlice:
        return take_slice(self.params_model, params)

    def deps(self) -> list[str]:
        own = self.module.replace(".", "/") + ".py" if self.module else None
        checked = [] if self.name == PARAMS_CHECK else [PARAMS_STAMP]  # every param checked first (params_check)
        return [*([own] if own and own not in self.code else []), *self.code, *self.data, *checked]

    def needed(self, view: Any) -> list[str]:
        """The declared data deps this run reads (:attr:`needs`), in declaration order."""
        wanted = set(self.needs(view)) if self.needs is not None else set(self.data)
        unknown = wanted - set(self.data)
        if unknown:
            raise ValueError(f"stage {self.name}: needs {sorted(unknown)}, which it does not declare in data")
        return [d for d in self.data if d in wanted]

    def all_outs(self) -> list[Out]:
        """Every out of dvc.yaml's stage entry, in order: the declared outs, the metrics file, the plot data."""
        mine = [] if self.cmd else [Out(f"metrics/stages/{self.name}.json", cache=False)]
        plots = [Out(p.path, cache=False, note=p.note) for p in self.plots if not p.in_stage]
        return [*self.outs, *mine, *plots]


def dag_order(found: list[Stage]) -> list[Stage]:
    """Dependency order (an out of one stage under a dep of another = an edge); ties by track, then name."""
    tracks = ["params", "text", "nethack", "summary"]
    owner = {o.path: s.name for s in found for o in [*s.all_outs(), *s.metrics, *(Out(p.path) for p in s.plots)]}

    def parents(s: Stage) -> set[str]:
        def related(a: str, b: str) -> bool:
            return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")
        return {o for d in s.deps() for path, o in owner.items() if o != s.name and related(d, path)}

    order: list[Stage] = []
    pending = sorted(found, key=lambda s: (tracks.index(s.track), s.name))
    while pending:
        done = {s.name for s in order}
        ready = next((s for s in pending if parents(s) <= done), None)
        if ready is None:
            raise ValueError(f"the stage declarations have a dependency cycle among {[s.name for s in pending]}")
        order.append(ready)
        pending.remove(ready)
    return order


#: The metric every stage writes (``execute`` adds it).
COMMON_METRIC_HELP = {"seconds": "wall-clock seconds of this run of the stage, from its start to its metrics file "
                                 "(a resumed run counts only its own)"}


def metric_pattern(key: str) -> re.Pattern[str]:
    """A declared metric key as a pattern: each ``{name}`` matches any text without a slash."""
    parts = re.split(r"(\{[^{}/]+\})", key)  # literal text and placeholders, alternately
    return re.compile("".join("[^/]+" if i % 2 else re.escape(part) for i, part in enumerate(parts)))


def undeclared_metrics(stage: Stage, keys: list[str]) -> list[str]:
    """The metric keys a stage wrote that neither it (:attr:`Stage.metric_help`) nor every stage declares."""
    patterns = [metric_pattern(k) for k in [*COMMON_METRIC_HELP, *stage.metric_help]]
    return [k for k in keys if not any(p.fullmatch(k) for p in patterns)]


@dataclass
class StageResult:
    metrics: dict[str, float | int | str] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)


@dataclass
class StageContext:
    """What a running stage gets besides params: the tracker (MLflow or no-op)."""

    tracker: Tracker = field(default_factory=Tracker)


def stage_module(name: str) -> ModuleType:
    if name not in STAGES:
        raise KeyError(f"unknown stage {name!r} (known: {', '.join(STAGES)})")
    return importlib.import_module(STAGES[name])


def declaration(name: str) -> Stage:
    return stage_module(name).STAGE


def metrics_path(params: Any, name: str) -> Path:
    return params.metrics_path("stages", f"{name}.json")


def data_paths(params: Any, stage: Stage) -> tuple[list[Path], list[Path]]:
    """The stage's deps and outs under ``data/``, mapped into ``params.data_dir``."""
    def mapped(paths: list[str]) -> list[Path]:
        return [params.data_path(p.removeprefix("data/")) for p in paths if p.startswith("data/")]

    return mapped([d for d in stage.deps() if d != PARAMS_STAMP]), mapped([o.path for o in stage.all_outs()])


def digest(path: Path) -> str | None:
    """Content hash of a stage input/output: a chunked dataset, a directory (model) or a file; None if absent."""
    if not path.exists():
        return None
    if path.is_file():
        return file_sha256(path)
    manifest = read_manifest(path)
    return dataset_hash(path) if manifest and manifest.get("complete") else dir_hash(path)


def digests(paths: list[Path]) -> dict[str, str]:
    return {str(p): d for p in paths if (d := digest(p)) is not None}


def require_inputs(params: Any, stage: Stage, view: Any) -> None:
    """Each data dep the run reads exists (a dataset: complete), else one InputError (exit 2) naming the stage that
    writes each missing one: before any work, for the built-in policy and a real ``policy.model`` alike."""
    missing: list[str] = []
    for dep in stage.needed(view):
        path = params.data_path(dep.removeprefix("data/"))
        writer = producing_stage(dep)
        if not path.exists():
            missing.append(f"{path} missing: run {writer} first (`curio stage {writer}`)" if writer
                           else f"{path} missing: run the stage that writes it first")
            continue
        if not (path.is_dir() and (path / MANIFEST).exists()):
            continue  # a model directory or a file: the stage verifies it when it loads it
        rerun = f"rerun `curio stage {writer}`" if writer else "rerun the stage that writes it"
        manifest = read_manifest(path)
        if manifest is None:
            raise InputError(f"{path}: its manifest is unreadable; {rerun}")
        if manifest.get("complete") is not True:
            raise InputError(f"{path}: no complete dataset; {rerun}")
    if missing:
        raise InputError(f"{stage.name}: " + "; ".join(missing))


def model_card(name: str, model: Path, lineage: dict, metrics: dict, params: dict) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in metrics.items())
    inputs = "\n".join(f"- `{p}`: `{d}`" for p, d in lineage["inputs"].items()) or "- (none)"
    return (f"# {model.name} — trained by stage `{name}`\n\n"
            f"- path: `{model}`\n- sha256 (content): `{lineage['outputs'].get(str(model), '?')}`\n"
            f"- git commit: `{lineage.get('git_commit', '?')}` (dirty: {lineage.get('git_dirty', '?')})\n"
            f"- params hash: `{lineage['params_hash']}`\n\n## Inputs\n\n{inputs}\n\n"
            f"## Stage metrics\n\n| metric | value |\n|---|---|\n{rows}\n\n"
            f"## Stage params\n\n```yaml\n{yaml.safe_dump(params, sort_keys=False)}```\n")


def execute(name: str, params: Any) -> StageResult:
    """Run one stage on its declared params slice, with tracking, and write its metrics file.

    The MLflow run carries the stage's lineage: git commit, params hash, every input under data/ as a dataset
    input with its content digest (``mlflow.log_input``), every output's digest (tags ``curio.output.*`` and
    ``lineage.json``), and each trained model (``Stage.models``) with a ``MODEL_CARD.md``.
    """
    require(params.reproducible, params.threads)  # the kernels, before the stage's module loads torch
    # SIGTERM / SIGINT: the stage saves its progress and stops within runner.grace_s (pipeline.core.interrupt);
    # one writer per output (pipeline.core.locks): the stage's name first, so a second run of it is refused at
    # once, then its outputs once its declaration is loaded
    with stopping(name, params.runner.grace_s), hold(params.data_dir, [f"stage-{name}"], f"stage {name}"), \
            StageTracking(params.tracking.experiment, params.tracking.enabled, params.tracking.artifact_root,
                          params.tracking.uri) as tracking:
        # MLflow loads in the tracking process (pipeline.core.tracking) while this one imports the stage's module
        stage = declaration(name)
        view: Any = stage.slice(params)
        require_inputs(params, stage, view)
        return _locked(name, params, stage, view, tracking)


def _locked(name: str, params: Any, stage: Stage, view: Any, tracking: StageTracking) -> StageResult:
    """The stage run, holding the locks of its outputs under ``data_dir``."""
    outs = [o.path.removeprefix("data/") for o in stage.all_outs() if o.path.startswith("data/")]
    with hold(params.data_dir, outs, f"stage {name}"):
        picked = {k: v for k, v in view.model_dump(mode="json").items() if k not in SHARED_KEYS}
        params_hash = params.section_hash(stage.params)
        git = git_tags() if params.tracking.enabled else {}
        start = time.time()
        with tracking.run(name, picked, tags={"curio.params_hash": params_hash, **git}) as tracker:
            return _tracked(name, params, stage, view, tracker, start, picked=picked, params_hash=params_hash,
                            git=git)


def _tracked(name: str, params: Any, stage: Stage, view: Any, tracker: Tracker, start: float, *,
             picked: dict, params_hash: str, git: dict) -> StageResult:
    """The stage's work inside its MLflow run: inputs, ``run``, the metrics file, cards, lineage and models."""
    recorder = ReadRecorder(params) if os.environ.get(READS_ENV) else None
    deps, outs = data_paths(params, stage)
    inputs = digests(deps) if tracker.enabled else {}
    tracker.log_inputs(inputs)
    # chunked work goes where params.runner says; training uses train_policy's accelerate processes
    try:
        with use_runner(params.runner), use_processes(params.train_policy.num_processes,
                                                      params.train_policy.accelerate_config):
            result: StageResult = stage_module(name).run(recorder or view, StageContext(tracker=tracker))
    finally:
        if recorder is not None:
            with open(os.environ[READS_ENV], "a") as f:
                f.write(json.dumps({"stage": name, "declared": stage.params,
                                    "reads": sorted(recorder.reads)}) + "\n")
    result.metrics.setdefault("seconds", round(time.time() - start, 2))
    out = metrics_path(params, name)
    atomic_write_json(out, result.metrics)
    tracker.log_metrics({k: v for k, v in result.metrics.items() if isinstance(v, int | float)})
    tracker.log_artifact(out)
    write_cards(outs, name)  # a README.md explaining the columns next to each dataset written
    if tracker.enabled:
        models = [params.data_path(m) for m in stage.models]
        lineage = {"stage": name, "params_hash": params_hash, "inputs": inputs,
                   "outputs": digests(outs + [m for m in models if m not in outs]),
                   "git_commit": git.get("curio.git_commit"), "git_dirty": git.get("curio.git_dirty")}
        tracker.set_tags({f"curio.output.{Path(p).name}": d[:16] for p, d in lineage["outputs"].items()})
        tracker.log_text(json.dumps(lineage, indent=2), "lineage.json")
        log_samples(tracker, outs)  # a few rows of each dataset written, as MLflow tables (pipeline/core/samples.py)
        for model in models:
            if model.exists() and not (model / IDLE).exists():
                tracker.log_model(model, name, params.tracking.experiment, stage.model_loader)
                tracker.log_text(model_card(name, model, lineage, result.metrics, picked),
                                 f"models/{model.name}/MODEL_CARD.md")
    return result


#: What a stage writes in an output instead of a result when its params leave it nothing to do (e.g.
#: train-reward-text unless rl_text.reward is motif): ``{"idle": "<why>"}``; no model is logged from it.
IDLE = "idle.json"


class ReadRecorder:
    """The whole params, recording each dotted key read through it: a value (``rollout_text.top_p``), or a
    section used as a whole (a method such as ``model_dump`` called on ``rollout_text.environment``). The
    root's own methods (``data_path``, ``section_hash``) read shared keys only and are not recorded."""

    def __init__(self, target: BaseModel, path: str = "", reads: set[str] | None = None) -> None:
        self._target, self._path = target, path
        self.reads: set[str] = set() if reads is None else reads

    @property
    def __class__(self) -> type:  # isinstance(recorder, LLMConfig) answers as for the object it records
        return type(self._target)

    def __reduce_ex__(self, protocol: int) -> Any:
        # pickled (a chunk job's loader sent to a worker, or hashed to key the worker's cache) as what it
        # records: the section is used whole, and the copy is the plain value
        if self._path:
            self.reads.add(self._path)
        return self._target.__reduce_ex__(protocol)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if name.startswith("_"):
            return value
        if name not in type(self._target).model_fields:
            if self._path:
                self.reads.add(self._path)
            return value
        key = f"{self._path}.{name}" if self._path else name
        if isinstance(value, BaseModel):
            return ReadRecorder(value, key, self.reads)
        self.reads.add(key)
        return value
