"""`make run`: `dvc repro` with every stage's MLflow run nested under one pipeline run."""

from __future__ import annotations

import subprocess
import sys

from pipeline.config import ConfigError, load_params
from pipeline.tracking import pipeline_run


def main(argv: list[str]) -> int:
    try:
        params = load_params("params.yaml")
    except ConfigError as e:
        print(f"curio: {e}", file=sys.stderr)
        return 2
    with pipeline_run("dvc-repro", experiment=params.tracking.experiment, enabled=params.tracking.enabled,
                      artifact_root=params.tracking.artifact_root, uri=params.tracking.uri):
        return subprocess.call(["dvc", "repro", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
