"""Trained models go through MLflow's own flavours: Logged Models of their run and versions in the registry, that
MLflow loads back (a real MLflow SQLite store, the tracking process a stage uses)."""

from __future__ import annotations

import mlflow
from mlflow import MlflowClient

from pipeline.core.tracking import stage_run
from pipeline.models import tiny


def test_a_text_policy_is_a_registered_transformers_model_and_other_outputs_stay_artifacts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    tokenizer = tiny.train_tokenizer(["guess the word", "is it an animal?"] * 20, 200)
    tiny.save(tiny.build_model(tokenizer, 1, 16, 2, 64), tokenizer, tmp_path / "sft")
    (tmp_path / "adapter").mkdir()  # not a model MLflow has a flavour for: logged as before, as files
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    with stage_run("train-sft", {}, experiment="curio") as tracker:
        tracker.log_model(tmp_path / "sft", "train-sft", "curio")
        tracker.log_model(tmp_path / "adapter", "train-sft", "curio")

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("curio")
    run = client.search_runs([exp.experiment_id])[0]
    models = client.search_logged_models([exp.experiment_id])
    assert [(m.name, m.source_run_id, m.tags.get("curio.stage")) for m in models] == \
        [("sft", run.info.run_id, "train-sft")]
    versions = client.search_model_versions("name='curio-train-sft'")
    assert [(str(v.version), v.run_id) for v in versions] == [("1", run.info.run_id)]
    assert [f.path for f in client.list_artifacts(run.info.run_id, "models/adapter")] == \
        ["models/adapter/adapter_config.json"]
    mlflow.set_tracking_uri(uri)
    pipe = mlflow.transformers.load_model("models:/curio-train-sft/1")
    assert pipe.task == "text-generation" and pipe.model.config.n_layer == 1
