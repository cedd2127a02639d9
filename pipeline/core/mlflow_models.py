"""Trained models logged through MLflow's own flavours, so they are MLflow Logged Models (the experiment's Models
tab, the run's "Logged models") and versions in the model registry (``curio-STAGE``), loadable with
``mlflow.transformers.load_model`` / ``mlflow.pytorch.load_model``:

- a Hugging Face model directory (``config.json``: the text policies) -> the ``transformers`` flavour, from the
  local checkpoint (nothing loaded to log it), task ``text-generation``;
- a model its stage names a loader for (``Stage.model_loader``: the NetHack reward model) -> the ``pytorch`` flavour;
- anything else (a LoRA adapter, sample-factory checkpoints, a bootstrap skipped for a pretrained model) stays
  what it was: run artifacts under ``models/NAME/``.

Runs in the tracking process (:mod:`pipeline.core.tracking`), where MLflow is already imported.
"""

from __future__ import annotations

import importlib
import logging
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def registered_name(experiment: str, stage: str) -> str:
    """The registry name of a stage's model: ``curio-train-sft``."""
    return f"{experiment}-{stage}"


def _pins(*packages: str) -> list[str]:
    """Requirements pinned to this environment's versions (given, so MLflow does not load the model to infer them)."""
    out = []
    for p in packages:
        try:
            out.append(f"{p}=={version(p)}")
        except PackageNotFoundError:
            continue
    return out


def flavour(path: Path, loader: str | None = None) -> str | None:
    """Which MLflow flavour logs the model directory ``path`` (None: plain artifacts); ``loader``: the stage's
    ``model_loader`` ("module:function"), which makes it a torch module for the pytorch flavour."""
    if loader:  # e.g. the NetHack reward model (its config.json is its own, not a transformers one)
        return "pytorch"
    if (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
        return "transformers"
    return None


def load_module(loader: str, path: Path) -> Any:
    """The torch module ``loader`` ("module:function", named by the stage that trained it) loads from ``path``."""
    module, _, function = loader.partition(":")
    model = getattr(importlib.import_module(module), function)(path)
    return model[0] if isinstance(model, tuple) else model


def log_model(mlflow: Any, path: str, stage: str, experiment: str, loader: str | None = None) -> str | None:
    """Log the model directory ``path`` with its flavour and register it; the logged model's id, or None when
    it has no flavour (then it is logged as run artifacts)."""
    directory = Path(path)
    kind = flavour(directory, loader)
    name = directory.name if directory.name != "model" else directory.parent.name
    if kind == "transformers":
        info = mlflow.transformers.log_model(
            transformers_model=str(directory), name=name, task="text-generation",
            registered_model_name=registered_name(experiment, stage),
            pip_requirements=_pins("transformers", "torch", "tokenizers", "safetensors"),
            tags={"curio.stage": stage}, model_type="text-generation")
    elif kind == "pytorch":
        model = load_module(loader, directory)
        info = mlflow.pytorch.log_model(
            # "pickle": MLflow's classic torch format (torch.save of the module, as on Databricks); its default "pt2"
            # traces forward() and so needs an example input, which a loader cannot give for every model
            model, name=name, registered_model_name=registered_name(experiment, stage), serialization_format="pickle",
            pip_requirements=_pins("torch"), tags={"curio.stage": stage}, model_type="reward-model")
    else:
        mlflow.log_artifacts(str(directory), artifact_path=f"models/{directory.name}")
        return None
    return info.model_id
