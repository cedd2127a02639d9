"""MLflow: one run per stage, nested under a pipeline run; params, metrics, artifacts, lineage tags.

The default store is a SQLite file under the repo (git-ignored); ``MLFLOW_TRACKING_URI`` overrides it.
A pipeline run (``curio pipeline`` / the Prefect ``pipeline`` flow) exports ``CURIO_PARENT_RUN_ID`` so the
stage runs started by ``dvc repro`` or by the flow nest under it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PARENT_ENV = "CURIO_PARENT_RUN_ID"
_SECRET_HINTS = ("key", "token", "secret", "password")


def tracking_uri(root: Path | None = None) -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    root = (root or Path.cwd()).resolve()
    return f"sqlite:///{root / 'mlflow.db'}"


def _setup(experiment: str) -> Any:
    logging.getLogger("alembic").setLevel(logging.WARNING)
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    if mlflow.get_experiment_by_name(experiment) is None:
        root = Path.cwd().resolve() / "mlartifacts"
        uri = tracking_uri()
        # SQLite stores keep artifacts next to the repo; remote servers choose their own artifact root.
        artifact_location = root.as_uri() if uri.startswith("sqlite") else None
        with contextlib.suppress(Exception):  # created concurrently by another stage
            mlflow.create_experiment(experiment, artifact_location=artifact_location)
    mlflow.set_experiment(experiment)
    return mlflow


def flatten_params(d: dict, prefix: str = "") -> dict[str, str]:
    """Flatten nested params to dotted keys; values that look like secrets are never logged."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_params(v, key + "."))
        elif any(h in k.lower() for h in _SECRET_HINTS) and not k.lower().endswith("_env"):
            continue
        else:
            out[key] = str(v)[:500]
    return out


class Tracker:
    """What a stage sees: log metrics/artifacts; a no-op when tracking is disabled."""

    def __init__(self, mlflow: Any = None) -> None:
        self._mlflow = mlflow

    @property
    def enabled(self) -> bool:
        return self._mlflow is not None

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self._mlflow is None:
            return
        clean = {k.replace("/", "_"): float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        if clean:
            self._mlflow.log_metrics(clean, step=step)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if self._mlflow is None:
            return
        path = Path(path)
        if path.is_dir():
            self._mlflow.log_artifacts(str(path), artifact_path=artifact_path or path.name)
        elif path.exists():
            self._mlflow.log_artifact(str(path), artifact_path=artifact_path)

    def set_tags(self, tags: dict[str, str]) -> None:
        if self._mlflow is not None:
            self._mlflow.set_tags(tags)


@contextlib.contextmanager
def stage_run(
    stage: str, params: dict, experiment: str = "curio", enabled: bool = True, tags: dict | None = None
) -> Iterator[Tracker]:
    """An MLflow run for one stage, nested under ``$CURIO_PARENT_RUN_ID`` when set."""
    if not enabled:
        yield Tracker(None)
        return
    mlflow = _setup(experiment)
    parent = os.environ.get(PARENT_ENV)
    all_tags = {"curio.stage": stage, **(tags or {})}
    with mlflow.start_run(run_name=stage, parent_run_id=parent, nested=bool(parent), tags=all_tags):
        mlflow.log_params(flatten_params(params))
        yield Tracker(mlflow)


@contextlib.contextmanager
def pipeline_run(name: str, experiment: str = "curio", enabled: bool = True) -> Iterator[str | None]:
    """The parent run of a whole pipeline; exports its id so child processes nest under it."""
    if not enabled:
        yield None
        return
    mlflow = _setup(experiment)
    with mlflow.start_run(run_name=name, tags={"curio.kind": "pipeline"}) as run:
        old = os.environ.get(PARENT_ENV)
        os.environ[PARENT_ENV] = run.info.run_id
        try:
            yield run.info.run_id
        finally:
            if old is None:
                os.environ.pop(PARENT_ENV, None)
            else:
                os.environ[PARENT_ENV] = old
