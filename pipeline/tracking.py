"""MLflow: one run per stage, nested under a pipeline run; params, metrics, artifacts, lineage tags.

The default store is a SQLite file under the repo (git-ignored); ``MLFLOW_TRACKING_URI`` overrides it, and
``tracking.uri`` in params overrides both (e.g. an ``mlflow server``: ``http://HOST:5000``). Artifacts go
to ``tracking.artifact_root`` (default ``mlartifacts``, resolved against the checkout the command runs in): a
copied checkout, even one whose ``mlflow.db`` came along, writes into its own directory, never the original's.
The experiment is tagged as a model-training experiment (``mlflow.experimentKind``), so the UI opens its runs
view, not the GenAI one. Each stage run carries its lineage (``record_lineage``).
A pipeline run (``curio pipeline`` / the Prefect ``pipeline`` flow) exports ``CURIO_PARENT_RUN_ID`` so the
stage runs started by ``dvc repro`` or by the flow nest under it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PARENT_ENV = "CURIO_PARENT_RUN_ID"
# The tag MLflow 3's UI reads to pick an experiment's view; this value is its "model training" kind.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
_SECRET_HINTS = ("key", "token", "secret", "password")


def tracking_uri(root: Path | None = None, uri: str | None = None) -> str:
    """``uri`` (params' ``tracking.uri``), else ``$MLFLOW_TRACKING_URI``, else this checkout's SQLite store."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    root = (root or Path.cwd()).resolve()
    return f"sqlite:///{root / 'mlflow.db'}"


def _setup(experiment: str, artifact_root: str = "mlartifacts", uri: str | None = None) -> Any:
    logging.getLogger("alembic").setLevel(logging.WARNING)
    import mlflow

    own_store = not uri and "MLFLOW_TRACKING_URI" not in os.environ  # read first: set_tracking_uri exports it
    uri = tracking_uri(uri=uri)
    mlflow.set_tracking_uri(uri)
    # SQLite stores keep artifacts in this checkout; remote servers choose their own artifact root.
    root = (Path.cwd() / artifact_root).resolve().as_uri() if uri.startswith("sqlite") else None
    if mlflow.get_experiment_by_name(experiment) is None:
        with contextlib.suppress(Exception):  # created concurrently by another stage
            mlflow.create_experiment(experiment, artifact_location=root)
    exp = mlflow.set_experiment(experiment)
    if root and own_store and exp.artifact_location != root:
        _reroot(uri, exp.experiment_id, exp.artifact_location, root)
    if exp.tags.get(EXPERIMENT_KIND[0]) != EXPERIMENT_KIND[1]:
        mlflow.set_experiment_tag(*EXPERIMENT_KIND)
    return mlflow


def _reroot(uri: str, experiment_id: str, old: str, new: str) -> None:
    """This checkout's own store (a copied mlflow.db) names another checkout's artifact directory: point the
    experiment's new runs at this one's. MLflow has no API to move an experiment's artifact location."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(uri.removeprefix("sqlite:///"))) as db, db:
        db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?", (new, int(experiment_id)))
    logging.getLogger(__name__).warning("mlflow: experiment %s stored artifacts in %s; new runs use %s",
                                        experiment_id, old, new)


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

    def log_inputs(self, digests: dict[str, str], context: str = "input") -> None:
        """Datasets (or models) a stage read, as MLflow dataset inputs: name = path, digest = content hash."""
        if self._mlflow is None or not digests:
            return
        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.meta_dataset import MetaDataset

        for path, digest in digests.items():
            with warnings.catch_warnings():  # "can be interpreted in multiple ways": both are the local source
                warnings.simplefilter("ignore", UserWarning)
                source = resolve_dataset_source(str(Path(path).resolve()))
            self._mlflow.log_input(MetaDataset(source, name=path, digest=digest[:32]), context=context)

    def log_text(self, text: str, artifact_file: str) -> None:
        if self._mlflow is not None:
            self._mlflow.log_text(text, artifact_file)


@contextlib.contextmanager
def stage_run(
    stage: str, params: dict, experiment: str = "curio", enabled: bool = True, tags: dict | None = None,
    artifact_root: str = "mlartifacts", uri: str | None = None,
) -> Iterator[Tracker]:
    """An MLflow run for one stage, nested under ``$CURIO_PARENT_RUN_ID`` when set."""
    if not enabled:
        yield Tracker(None)
        return
    mlflow = _setup(experiment, artifact_root, uri)
    parent = os.environ.get(PARENT_ENV)
    all_tags = {"curio.stage": stage, **(tags or {})}
    with mlflow.start_run(run_name=stage, parent_run_id=parent, nested=bool(parent), tags=all_tags):
        mlflow.log_params(flatten_params(params))
        yield Tracker(mlflow)


@contextlib.contextmanager
def pipeline_run(name: str, experiment: str = "curio", enabled: bool = True,
                 artifact_root: str = "mlartifacts", uri: str | None = None) -> Iterator[str | None]:
    """The parent run of a whole pipeline; exports its id so child processes nest under it."""
    if not enabled:
        yield None
        return
    mlflow = _setup(experiment, artifact_root, uri)
    with mlflow.start_run(run_name=name, tags={"curio.kind": "pipeline", **git_tags()}) as run:
        old = os.environ.get(PARENT_ENV)
        os.environ[PARENT_ENV] = run.info.run_id
        try:
            yield run.info.run_id
        finally:
            if old is None:
                os.environ.pop(PARENT_ENV, None)
            else:
                os.environ[PARENT_ENV] = old


def git_tags() -> dict[str, str]:
    """The checkout's commit (MLflow's own source tag and Curio's) and whether uncommitted changes exist."""
    import subprocess

    def git(*args: str) -> str:
        res = subprocess.run(["git", *args], capture_output=True, text=True)
        return res.stdout.strip() if res.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {}
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"mlflow.source.git.commit": commit, "curio.git_commit": commit, "curio.git_dirty": str(dirty).lower()}
