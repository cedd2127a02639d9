"""Leave-one-group-out: train on every group but one, evaluate on the one left out (PAPRIKA's zero-shot
transfer to held-out task groups).

``logo_params(params, G)`` is ``params`` with ``games.groups`` = the pool minus G (the pool defaults to
``games.groups``), ``games.eval_groups = [G]``, ``data_dir = <data_dir>/logo_G`` and its own MLflow experiment.
Rollouts and training read only ``games.groups``, evaluate-text only the evaluation groups, so the run learns
from the pool and is measured on G alone; bootstrap pre-trains the built-in model on both (its world knowledge,
as a real LLM's pre-training covers G too). ``run_logo`` runs evaluate-text and every stage it depends on in
``dvc.yaml``, in DAG order, with ``pipeline.core.stage.execute`` (the code ``dvc repro`` runs), into that data dir;
each stage resumes from what is already there. ``logo_report`` prints held-out success before (base) and
after training (sft / dpo / rl) and writes it to ``<data_dir>/logo.md``.

The DVC-tracked equivalent, one experiment per held-out group (outputs stay under ``data/``)::

    dvc exp run -S 'games.groups=[wordle,mastermind]' -S 'games.eval_groups=[twenty_questions]'
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from pipeline.core.artifacts import atomic_write_bytes
from pipeline.core.config import ConfigError, _set_dotted
from pipeline.core.dag import ancestors, dag_order, stage_parents
from pipeline.core.stage import PARAMS_CHECK, execute
from pipeline.envs.base import game_class

TARGET = "evaluate-text"


def logo_params(params: BaseModel, group: str, pool: list[str] | None = None,
                data_root: str | None = None) -> BaseModel:
    """The params of the leave-``group``-out run (ConfigError, one line, when it cannot be built)."""
    for name in [group, *(pool or [])]:
        try:
            game_class(name)
        except KeyError:
            raise ConfigError(f"logo: unknown task group {name!r}") from None
    pool = list(dict.fromkeys(pool or params.games.groups))
    train = [g for g in pool if g != group]
    if not train:
        raise ConfigError(f"logo: no training group left once {group!r} is held out of {pool}; "
                          "add groups with --pool or -S games.groups=[...]")
    raw = params.model_dump(mode="json")
    _set_dotted(raw, "games.groups", train)
    _set_dotted(raw, "games.eval_groups", [group])
    _set_dotted(raw, "data_dir", str(Path(data_root or params.data_dir) / f"logo_{group}"))
    _set_dotted(raw, "metrics_dir", str(Path(data_root or params.data_dir) / f"logo_{group}" / "metrics"))
    _set_dotted(raw, "tracking.experiment", f"{params.tracking.experiment}-logo-{group}")
    return type(params).model_validate(raw)


def stages_for(target: str = TARGET, dvc_yaml: str | Path = "dvc.yaml") -> list[str]:
    """``target`` and every stage it depends on (an out of one stage that is a dep of another), in DAG order;
    not check-params, DVC's guard of its outputs (params given here were checked when they loaded)."""
    needed = ancestors(stage_parents(dvc_yaml), target) | {target}
    return [n for n in dag_order(dvc_yaml) if n in needed and n != PARAMS_CHECK]


def run_logo(params: BaseModel, dvc_yaml: str | Path = "dvc.yaml") -> list[str]:
    """Run the text track into ``params.data_dir``; returns the stages run."""
    names = stages_for(TARGET, dvc_yaml)
    for name in names:
        print(f"logo: {name} (train {params.games.groups}, evaluate {params.games.eval_groups}) "
              f"-> {params.data_dir}", flush=True)
        execute(name, params)
    return names


def logo_rows(params: BaseModel, group: str) -> list[dict]:
    """Per policy: held-out success rate and mean turns on ``group``, from evaluate-text's metrics."""
    import json

    path = params.metrics_path("stages", f"{TARGET}.json")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no evaluation yet (run `curio logo {group}` without --report-only)")
    metrics = json.loads(path.read_text())
    rows = []
    for p in params.evaluate_text.policies:
        if f"{p}/{group}/success_rate" in metrics:
            rows.append({"policy": p, "success_rate": metrics[f"{p}/{group}/success_rate"],
                         "mean_turns": metrics[f"{p}/{group}/mean_turns"]})
    if not rows:
        raise FileNotFoundError(f"{path}: holds no results for group {group!r}")
    return rows


def logo_report(params: BaseModel, group: str) -> str:
    """Markdown table: held-out success before (base) vs after (sft / dpo / rl); also written to logo.md."""
    rows = logo_rows(params, group)
    base = next((r["success_rate"] for r in rows if r["policy"] == "base"), None)
    lines = [
        f"Held-out group: {group}; trained on: {', '.join(params.games.groups)}; data: {params.data_dir}",
        "",
        "| policy | held-out success | mean turns (successes) | vs base |",
        "|---|---|---|---|",
    ]
    for r in rows:
        name = "base (before)" if r["policy"] == "base" else r["policy"]
        delta = "" if base is None or r["policy"] == "base" else f"{r['success_rate'] - base:+.3f}"
        lines.append(f"| {name} | {r['success_rate']:.3f} | {r['mean_turns']:.2f} | {delta} |")
    text = "\n".join(lines) + "\n"
    atomic_write_bytes(params.data_path("logo.md"), text.encode())
    return text
