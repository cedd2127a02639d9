"""The report's "Run" section: what produced the numbers on the page.

The commit(s) and date come from the stages' own MLflow runs (the latest finished run of each stage: its
``curio.git_commit`` tag, its end time), not from the clock or the checkout at report time, so rerunning
``curio report`` over the same results writes the same bytes (``dvc status`` stays clean). The params hash and
the values that differ from the schema's defaults come from the params the report ran with.
"""

from __future__ import annotations

import datetime as dt
import functools
import html
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

#: Where ``mlflow ui`` serves by default; a run's page is ``UI/#/experiments/ID/runs/RUN``.
DEFAULT_UI = "http://127.0.0.1:5000"


def stage_runs(params: Any) -> tuple[list[dict[str, Any]], str | None]:
    """The latest FINISHED MLflow run of each stage on these params (``{stage, run_id, experiment_id, commit,
    dirty, end, parent}``, in stage order) and the UI address; nothing when tracking is off or its store does
    not exist."""
    from pipeline.core.tracking import tracking_uri

    if not params.tracking.enabled:
        return [], None
    uri = tracking_uri(uri=params.tracking.uri)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return [], None
    import logging

    logging.getLogger("alembic").setLevel(logging.WARNING)
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(params.tracking.experiment)
    if exp is None:
        return [], None
    runs = client.search_runs([exp.experiment_id], filter_string="attributes.status = 'FINISHED'",
                              order_by=["attributes.end_time DESC"], max_results=2000)
    latest: dict[str, Any] = {}
    for run in runs:
        stage = run.data.tags.get("curio.stage")
        # a run on other params (an overridden Prefect run, an experiment since undone) did not make these results
        if stage and stage not in latest and run.data.tags.get("curio.params_hash") == _params_hash(params, stage):
            latest[stage] = run
    ui = uri.rstrip("/") if uri.startswith(("http://", "https://")) else DEFAULT_UI
    rows = [{"stage": stage, "run_id": r.info.run_id, "experiment_id": exp.experiment_id,
             "commit": r.data.tags.get("curio.git_commit", ""), "dirty": r.data.tags.get("curio.git_dirty") == "true",
             "end": r.info.end_time, "parent": r.data.tags.get("mlflow.parentRunId")}
            for stage, r in sorted(latest.items(), key=lambda kv: kv[1].info.end_time or 0)]
    return rows, ui


def _params_hash(params: Any, stage: str) -> str | None:
    """The params hash a stage's MLflow run carries when it ran on ``params`` (``pipeline.core.stage.execute``)."""
    from pipeline.core.registry import STAGES

    return params.section_hash(declared_params(stage)) if stage in STAGES else None


@functools.cache
def _dvc_yaml_stages(path: str = "dvc.yaml") -> dict[str, Any]:
    try:
        return yaml.safe_load(Path(path).read_text()).get("stages") or {}
    except (OSError, AttributeError, yaml.YAMLError):
        return {}


@functools.cache
def declared_params(stage: str) -> list[str]:
    """The params a stage declares, as dvc.yaml lists them: ``curio generate`` writes them from the declaration,
    and ``curio generate --check`` fails when they differ. Read from there, the report does not import every stage
    module (torch, transformers, TRL: ~10 s). Where dvc.yaml does not list the stage, its declaration."""
    spec = _dvc_yaml_stages().get(stage)
    if isinstance(spec, dict):
        return list(spec.get("params") or [])
    from pipeline.core.stage import declaration

    return list(declaration(stage).params)


def run_link(ui: str, experiment_id: str, run_id: str) -> str:
    """A run's page in MLflow's "Model training" view (the UI opens on its GenAI view unless told otherwise)."""
    return f"{ui}/#/experiments/{quote(str(experiment_id))}/runs/{quote(run_id)}?workflowType=machine_learning"


def _when(ms: int | None) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M UTC") if ms else "?"


def run_section(params: Any) -> str:
    """The "Run" section's HTML: commit, date, params hash, non-default params, links to each stage's MLflow run."""
    from pipeline.params import Params, kept_values

    esc = html.escape
    rows, ui = stage_runs(params)
    commits = sorted({(r["commit"][:12] + (" (uncommitted changes)" if r["dirty"] else "")) for r in rows
                      if r["commit"]})
    facts = [
        ("commit", ", ".join(commits) if commits else "not recorded (tracking off)"),
        ("finished", _when(max((r["end"] or 0 for r in rows), default=None)) if rows else "not recorded"),
        ("params hash", params.section_hash(list(Params.model_fields))[:16]),
    ]
    body = "<table><tbody>" + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in facts)
    body += "</tbody></table>"
    changed = kept_values(params)
    body += ("<p>Params that differ from the schema's defaults:</p><ul>"
             + "".join(f"<li><code>{esc(c)}</code></li>" for c in changed) + "</ul>") if changed else \
        "<p>Every param is the schema's default (params.yaml as generated).</p>"
    if rows:
        links = "".join(
            f"<tr><td>{esc(r['stage'])}</td><td><a href='{esc(run_link(ui, r['experiment_id'], r['run_id']))}'>"
            f"{esc(r['run_id'][:12])}</a></td><td>{esc(r['commit'][:12])}</td><td>{esc(_when(r['end']))}</td></tr>"
            for r in rows)
        parents = sorted({r["parent"] for r in rows if r["parent"]})
        body += ("<p>Each stage's MLflow run (links open in <code>mlflow ui</code> at "
                 f"{esc(ui)}; their parent pipeline run{'s' if len(parents) > 1 else ''}: "
                 + ", ".join(f"<a href='{esc(run_link(ui, rows[0]['experiment_id'], p))}'>{esc(p[:12])}</a>"
                             for p in parents) + ").</p>" if parents else
                 f"<p>Each stage's MLflow run (links open in <code>mlflow ui</code> at {esc(ui)}).</p>")
        body += ("<table><thead><tr><th>stage</th><th>MLflow run</th><th>commit</th><th>finished</th></tr></thead>"
                 f"<tbody>{links}</tbody></table>")
    return f"<section><h2>Run</h2>{body}</section>"


#: What the LLM ledger's columns count (pipeline/llm/ledger.py).
LEDGER_NOTE = (
    "<p class='note'>Per stage and LLM role: <b>requests</b> the items the stage asked the role to answer; "
    "<b>cache hits</b> distinct requests answered by the persistent LLM cache (a rerun pays nothing for them); "
    "<b>sent</b> requests that reached a model or server; <b>tokens in / out</b> the prompt and completion tokens of "
    "those sent requests; <b>p50 latency</b> the median time of one sent request; <b>failures</b> sent requests that "
    "failed for good. A role answered by a program (the rules / exact-match judge, the oracle environment) "
    "counts its requests but sends none, so its sent and token columns stay 0.</p>")
