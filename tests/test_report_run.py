"""`curio report` writes the same bytes over the same results (so `dvc status` stays clean after `make run`), and
says what produced them: commit, date, params hash, non-default params, each stage's MLflow run."""

from __future__ import annotations

import json

from conftest import curio, make_project

EVAL_TEXT = {"base/success_rate": 0.25, "base/episodes": 48, "sft/success_rate": 0.5, "sft/episodes": 48,
             "judge_requests": 96, "judge_cache_hits": 0, "judge_sent": 0, "judge_tokens_in": 0,
             "judge_tokens_out": 0}


def _results(project):
    stages, plots = project / "metrics" / "stages", project / "metrics" / "plots"
    stages.mkdir(parents=True)
    plots.mkdir()
    (stages / "evaluate-text.json").write_text(json.dumps(EVAL_TEXT))
    (plots / "sft_loss.json").write_text(json.dumps([{"step": i, "loss": 3 / (i + 1)} for i in range(20)]))


def test_the_report_is_the_same_bytes_on_a_rerun(tmp_path):
    project = make_project(tmp_path, ["tracking.enabled=false", "games.max_eval_tasks=8"])
    _results(project)
    pages = []
    for _ in range(2):  # two processes: matplotlib's ids and date would differ between them
        curio(["report"], cwd=project)
        pages.append((project / "data" / "report.html").read_bytes())
    assert pages[0] == pages[1]
    page = pages[0].decode()
    assert page.count("<svg") == 2 and "clipPath" in page  # the figures whose ids used to differ
    assert "games.max_eval_tasks=8 (default None)" in page  # non-default params
    assert "params hash" in page and "not recorded (tracking off)" in page
    assert "counts its requests but sends none" in page  # the ledger's columns explained


def test_the_report_links_each_stage_to_its_mlflow_run(tmp_path):
    import mlflow
    from mlflow import MlflowClient

    project = make_project(tmp_path, [])
    _results(project)
    uri = f"sqlite:///{project / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("curio", artifact_location=(project / "mlartifacts").as_uri())
    parent = client.create_run(exp, run_name="dvc-repro").info.run_id
    from pipeline.core.stage import declaration
    from pipeline.params import load_params

    params = load_params(project / "params.yaml")
    ids = {}
    for stage, status, ours in (("train-sft", "FINISHED", True), ("evaluate-text", "FINISHED", True),
                                ("evaluate-text", "FAILED", True), ("evaluate-text", "FINISHED", False)):
        # the last: a later run on other params (an overridden Prefect run), which did not make these results
        digest = params.section_hash(declaration(stage).params) if ours else "0" * 64
        run = client.create_run(exp, run_name=stage, tags={"curio.stage": stage, "curio.git_commit": "a" * 40,
                                                           "curio.git_dirty": "false", "curio.params_hash": digest,
                                                           "mlflow.parentRunId": parent})
        client.set_terminated(run.info.run_id, status=status)
        if status == "FINISHED" and ours:
            ids[stage] = run.info.run_id
    del mlflow
    pages = []
    for _ in range(2):
        curio(["report"], cwd=project)
        pages.append((project / "data" / "report.html").read_bytes())
    assert pages[0] == pages[1]
    page = pages[0].decode()
    for run_id in ids.values():  # each stage's latest finished run on these params
        assert f"http://127.0.0.1:5000/#/experiments/{exp}/runs/{run_id}?workflowType=machine_learning" in page
    assert page.count("/runs/") == 3  # two stages and their parent pipeline run
    assert "aaaaaaaaaaaa" in page and "Every param is the schema's default" in page
