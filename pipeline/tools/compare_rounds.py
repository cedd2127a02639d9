"""``curio compare rounds``: how held-out success grows with GRPO's rounds, in one finished run.

rl-text with ``rl_text.algorithm: grpo`` and val rounds keeps every round's policy (``data/rl_text/rounds/round-NNN``)
and the one with the best val success becomes ``data/rl_text/model``; evaluate-text scores only that one. This plays
every round's policy on the held-out tasks exactly as evaluate-text played the run's own policies (its stage, the
same tasks, episodes and seed), each in a data dir of its own under ``data/grpo_rounds/`` (a rerun resumes: a round
already scored is read back), and prints per round, the DPO policy counting as round 0:

- val success (what chose the kept round) and the training episodes played so far;
- held-out success ± binomial s.e. (= mean@k), pass@k, and the paired difference from the DPO policy over the same
  tasks (d̄ ± SE(d̄), :func:`pipeline.reporting.breakdown.paired_difference`);
- rl-text's minutes up to that round's checkpoint (its files' times: from the stage's start, its end less its
  ``seconds``).

The kept round was chosen on val; the other rounds' held-out figures are a report of how the gain grows, never a
choice. Written to ``data/grpo_rounds/rounds.md`` and ``rounds.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.core.artifacts import read_manifest, read_rows
from pipeline.params import load_params
from pipeline.tools import ToolError
from pipeline.tools.compare_rl_text import curio, paired, pct
from pipeline.tools.compare_rl_text import score as scored

COLUMNS = ["group", "task_id", "success", "policy", "turns", "score", "invalid"]


def figures(s: dict, reference: dict) -> dict:
    """One policy's :func:`scored` episodes as a row: success ± s.e., pass@k and the paired difference from
    ``reference`` (the DPO policy's)."""
    d = paired(s, reference)
    return {"success": s["success_rate"], "se": s["se"], "pass_at_k": s["pass_at_k"], "episodes": s["episodes"],
            "vs_dpo": d["diff"], "vs_dpo_se": d["se"], "tasks": d["tasks"]}


def round_dirs(rounds: Path) -> list[Path]:
    return sorted(d for d in rounds.glob("round-[0-9]*") if (d / "DONE").exists())


def evaluate_round(run: Path, params, round_dir: Path, overrides: list[str]) -> list[dict]:
    """evaluate-text's episodes of one round's policy (the ``rl`` policy of a data dir of its own)."""
    data = run / params.data_dir / "grpo_rounds" / round_dir.name
    (data / "rl_text").mkdir(parents=True, exist_ok=True)
    for link, target in ((data / "rl_text" / "model", round_dir.resolve()),
                         (data / "bootstrap", (run / params.data_path("bootstrap")).resolve())):
        if not link.is_symlink() and target.exists():
            os.symlink(target, link)
    # the stage itself skips a round scored already with these params (its manifest's params and upstream hashes)
    curio(run, ["stage", "evaluate-text", *[x for o in overrides for x in ("-S", o)], "-S", f"data_dir={data}",
                "-S", f"metrics_dir={data / 'metrics'}", "-S", "evaluate_text.policies=[rl]",
                "-S", "tracking.enabled=false"])
    return read_rows(data / "evaluate_text", COLUMNS)


def compare_rounds(run: Path, overrides: list[str]) -> list[str]:
    run = run.resolve()
    if not (run / "params.yaml").exists():
        raise ToolError(f"no params.yaml in {run}: give the checkout of a finished run (--run)")
    params = load_params(run / "params.yaml", overrides)
    k = params.evaluate_text.trajectories_per_task
    rounds_root = run / params.data_path("rl_text", "rounds")
    rounds = round_dirs(rounds_root)
    history_file = run / params.plots_path("rl_rounds.json")
    stage_metrics = run / params.metrics_path("stages", "rl-text.json")
    if not rounds or not history_file.exists() or not stage_metrics.exists():
        raise ToolError(f"no finished GRPO rounds under {rounds_root}: run rl-text "
                        "with rl_text.algorithm=grpo to the end first")
    held = run / params.data_path("evaluate_text")
    if not (read_manifest(held) or {}).get("complete"):
        raise ToolError(f"{held} is not a finished evaluate-text: run it first (its DPO rows are round 0)")
    own = read_rows(held, COLUMNS)
    dpo_rows = [r for r in own if r["policy"] == "dpo"]
    if not dpo_rows:
        raise ToolError(f"{held} has no DPO rows: evaluate_text.policies must include dpo")
    dpo = scored(dpo_rows, k)
    history = {h["round"]: h for h in json.loads(history_file.read_text())}
    stage = json.loads(stage_metrics.read_text())
    kept = stage.get("rl/chosen_round", stage.get("grpo/chosen_round"))  # grpo/: runs before the shared rounds
    # when rl-text started: its metrics file's time (written as it ends) less its seconds
    began = stage_metrics.stat().st_mtime - stage["seconds"] if "seconds" in stage else None

    start = rounds_root / "round-start" / "val.json"  # the DPO policy's val
    table = [{"rounds": 0, "policy": "DPO", "val": json.loads(start.read_text()).get("val_success"),
              "train_episodes": 0, **figures(dpo, dpo),
              "minutes": None if began is None else (start.stat().st_mtime - began) / 60}]
    for i, d in enumerate(rounds):
        rows = evaluate_round(run, params, d, overrides)
        h = history.get(i, {})
        table.append({"rounds": i + 1, "policy": d.name, "val": h.get("val_success"),
                      "train_episodes": h.get("episodes"), **figures(scored(rows, k), dpo),
                      "minutes": None if began is None else (d.joinpath("DONE").stat().st_mtime - began) / 60})
    how = "chosen on val" if any(r["val"] is not None for r in table) else "the last, with no val rounds"
    lines = [f"Held-out per GRPO round ({table[1]['episodes']} episodes a policy, {k} a task; the DPO policy is "
             f"round 0; the round rl-text kept, {how}: {kept})", "",
             f"| rounds | val success | train episodes | held-out success ± s.e. | pass@{k} | − DPO, paired "
             "| rl-text minutes |", "|---|---|---|---|---|---|---|"]
    for r in table:
        mark = " (kept)" if r["rounds"] == kept else ""
        diff = "" if r["rounds"] == 0 else f"{pct(r['vs_dpo'], '+')} ± {pct(r['vs_dpo_se'])} ({r['tasks']} tasks)"
        minutes = "" if r["minutes"] is None else f"{r['minutes']:.1f}"
        lines.append(f"| {r['rounds']}{mark} | {pct(r['val'])} | {r['train_episodes']} | {pct(r['success'])} ± "
                     f"{pct(r['se'])} | {pct(r['pass_at_k'])} | {diff} | {minutes} |")
    out = run / params.data_path("grpo_rounds")
    out.mkdir(parents=True, exist_ok=True)
    (out / "rounds.md").write_text("\n".join(lines) + "\n")
    (out / "rounds.json").write_text(json.dumps({"kept": kept, "k": k, "rounds": table}, indent=1))
    return lines
