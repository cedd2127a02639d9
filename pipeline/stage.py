"""The stage contract: ``run(params) -> StageResult`` plus the wrapper that every entry point calls.

Each stage module in ``stages/`` defines ``NAME`` (the dvc.yaml stage name), ``PARAMS`` (the dotted params
keys it reads, exactly as listed in dvc.yaml) and ``run``. ``execute`` adds what every stage shares: the
MLflow run, the metrics file ``metrics/stages/NAME.json`` (git-tracked) and timing. DVC and Prefect both call
``execute``.
"""

from __future__ import annotations

import importlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import yaml

from pipeline.artifacts import atomic_write_json, dataset_hash, dir_hash, file_sha256, read_manifest
from pipeline.cards import write_cards
from pipeline.config import Params
from pipeline.models.launch import use_processes
from pipeline.runners import use_runner
from pipeline.tracking import Tracker, git_tags, stage_run

# dvc.yaml stage name -> module implementing it. Adding a stage = a module + a line here + a dvc.yaml entry.
STAGES: dict[str, str] = {
    "bootstrap": "stages.bootstrap",
    "rollout-text": "stages.rollout",
    "annotate-text": "stages.annotate",
    "pairs-text": "stages.pairs",
    "train-sft": "stages.train_sft",
    "reflogprobs": "stages.reflogprobs",
    "train-dpo": "stages.train_dpo",
    "rl-text": "stages.rl.text",
    "evaluate-text": "stages.evaluate",
    "rollout-nethack": "stages.rollout_nethack",
    "annotate-nethack": "stages.annotate_nethack",
    "pairs-nethack": "stages.pairs_nethack",
    "train-reward": "stages.train_reward",
    "rl-nethack": "stages.rl.appo",
    "evaluate-nethack": "stages.evaluate_nethack",
}


# Trained models each stage writes (under data_dir), logged to MLflow with a model card. A new training stage adds
# its line here.
TRAINED_MODELS: dict[str, list[str]] = {
    "bootstrap": ["bootstrap/model"],
    "train-sft": ["train_policy/sft"],
    "train-dpo": ["train_policy/dpo"],
    "rl-text": ["rl_text/model"],
    "train-reward": ["reward_model"],
    "rl-nethack": ["rl_nethack"],
}


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


def metrics_path(params: Params, name: str) -> Path:
    return params.metrics_path("stages", f"{name}.json")


def data_paths(params: Params, name: str, dvc_yaml: str | Path = "dvc.yaml") -> tuple[list[Path], list[Path]]:
    """The stage's deps and outs under ``data/`` in dvc.yaml, mapped into ``params.data_dir`` (none without a
    dvc.yaml in the working directory)."""
    if not Path(dvc_yaml).exists():
        return [], []
    spec = yaml.safe_load(Path(dvc_yaml).read_text())["stages"].get(name, {})

    def mapped(entries: list) -> list[Path]:
        paths = [next(iter(e)) if isinstance(e, dict) else e for e in entries]
        return [params.data_path(p.removeprefix("data/")) for p in paths if p.startswith("data/")]

    return mapped(spec.get("deps", [])), mapped(spec.get("outs", []))


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


def model_card(name: str, model: Path, lineage: dict, metrics: dict, params: dict) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in metrics.items())
    inputs = "\n".join(f"- `{p}`: `{d}`" for p, d in lineage["inputs"].items()) or "- (none)"
    return (f"# {model.name} — trained by stage `{name}`\n\n"
            f"- path: `{model}`\n- sha256 (content): `{lineage['outputs'].get(str(model), '?')}`\n"
            f"- git commit: `{lineage.get('git_commit', '?')}` (dirty: {lineage.get('git_dirty', '?')})\n"
            f"- params hash: `{lineage['params_hash']}`\n\n## Inputs\n\n{inputs}\n\n"
            f"## Stage metrics\n\n| metric | value |\n|---|---|\n{rows}\n\n"
            f"## Stage params\n\n```yaml\n{yaml.safe_dump(params, sort_keys=False)}```\n")


def execute(name: str, params: Params) -> StageResult:
    """Run one stage with tracking and write its metrics file.

    The MLflow run carries the stage's lineage: git commit, params hash, every input under data/ as a dataset
    input with its content digest (``mlflow.log_input``), every output's digest (tags ``curio.output.*`` and
    ``lineage.json``), and each trained model (``TRAINED_MODELS``) with a ``MODEL_CARD.md``.
    """
    module = stage_module(name)
    keys: list[str] = list(module.PARAMS)
    picked = {k: v for k, v in params.model_dump(mode="json").items() if k in {x.split(".")[0] for x in keys}}
    params_hash = params.section_hash(keys)
    git = git_tags() if params.tracking.enabled else {}
    start = time.time()
    with stage_run(
        name,
        picked,
        experiment=params.tracking.experiment,
        enabled=params.tracking.enabled,
        tags={"curio.params_hash": params_hash, **git},
        artifact_root=params.tracking.artifact_root, uri=params.tracking.uri,
    ) as tracker:
        deps, outs = data_paths(params, name)
        inputs = digests(deps) if tracker.enabled else {}
        tracker.log_inputs(inputs)
        # chunked work goes where params.runner says; training uses train_policy's accelerate processes
        with use_runner(params.runner), use_processes(params.train_policy.num_processes,
                                                      params.train_policy.accelerate_config):
            result: StageResult = module.run(params, StageContext(tracker=tracker))
        result.metrics.setdefault("seconds", round(time.time() - start, 2))
        out = metrics_path(params, name)
        atomic_write_json(out, result.metrics)
        tracker.log_metrics({k: v for k, v in result.metrics.items() if isinstance(v, int | float)})
        tracker.log_artifact(out)
        write_cards(outs, name)  # a README.md explaining the columns next to each dataset written
        if tracker.enabled:
            models = [params.data_path(m) for m in TRAINED_MODELS.get(name, [])]
            lineage = {"stage": name, "params_hash": params_hash, "inputs": inputs,
                       "outputs": digests(outs + [m for m in models if m not in outs]),
                       "git_commit": git.get("curio.git_commit"), "git_dirty": git.get("curio.git_dirty")}
            tracker.set_tags({f"curio.output.{Path(p).name}": d[:16] for p, d in lineage["outputs"].items()})
            tracker.log_text(json.dumps(lineage, indent=2), "lineage.json")
            for model in models:
                if model.exists():
                    tracker.log_artifact(model, f"models/{model.name}")
                    tracker.log_text(model_card(name, model, lineage, result.metrics, picked),
                                     f"models/{model.name}/MODEL_CARD.md")
    return result
