"""What runs the DAG: `make run` (run_dvc.py: `dvc repro` under one MLflow pipeline run, its branches side by side),
the Prefect flows (flows.py, an overridden run's workspace: flow_workspace.py, its artifacts' links:
artifact_links.py). Each runs a stage through ``pipeline.core.stage.execute``, as ``curio stage`` does."""
