"""The stage contract: ``run(params) -> StageResult`` plus the wrapper that every entry point calls.

Each stage module in ``stages/`` defines ``NAME`` (the dvc.yaml stage name), ``PARAMS`` (the dotted params
keys it reads, exactly as listed in dvc.yaml) and ``run``. ``execute`` adds what every stage shares: the
MLflow run, the metrics file ``data/metrics/NAME.json`` and timing. DVC and Prefect both call ``execute``.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from pipeline.artifacts import atomic_write_json
from pipeline.config import Params
from pipeline.tracking import Tracker, stage_run

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
    return params.data_path("metrics", f"{name}.json")


def execute(name: str, params: Params) -> StageResult:
    """Run one stage with tracking and write its metrics file."""
    module = stage_module(name)
    keys: list[str] = list(module.PARAMS)
    picked = {k: v for k, v in params.model_dump(mode="json").items() if k in {x.split(".")[0] for x in keys}}
    start = time.time()
    with stage_run(
        name,
        picked,
        experiment=params.tracking.experiment,
        enabled=params.tracking.enabled,
        tags={"curio.params_hash": params.section_hash(keys)},
    ) as tracker:
        result: StageResult = module.run(params, StageContext(tracker=tracker))
        result.metrics.setdefault("seconds", round(time.time() - start, 2))
        out = metrics_path(params, name)
        atomic_write_json(out, result.metrics)
        tracker.log_metrics({k: v for k, v in result.metrics.items() if isinstance(v, int | float)})
        tracker.log_artifact(out)
    return result
