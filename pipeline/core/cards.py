"""Dataset cards: a ``README.md`` next to every chunked dataset a stage writes, explaining its columns.

``pipeline.core.stage.execute`` writes one for each complete dataset under the stage's outs (and one level below,
e.g. ``pairs_text/preferences``) after the stage finishes: the schema read from the Parquet parts, what each
column means (``COLUMNS``), row count, params hash and upstream hashes from the manifest. A stage adding a
column documents it here; an undocumented column is listed as such.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from pipeline.core.artifacts import atomic_write_bytes, read_manifest

COLUMNS: dict[str, str] = {
    # text-track episodes (pipeline/text/play.py)
    "group": "task group (game) the episode was played in, e.g. twenty_questions",
    "task_id": "id of the task within its group",
    "secret": "the task's hidden state (e.g. the 20Q object) as plain-text JSON; the policy never sees it, "
              "it is kept so results can be audited and split by secret",
    "category": "category of the secret (20Q: the knowledge base's category)",
    "difficulty": "difficulty bucket of the task (easy / medium / hard, by rank thirds of scripted turns)",
    "split": "train or eval (held-out tasks)",
    "sample": "index of this sample among the trajectories drawn for the same task",
    "conversation": "the whole dialogue as chat messages (role, content), system prompt first",
    "final_action": "the policy's last move (its final guess)",
    "success": "the task was solved (text: the goal reached; NetHack goal tasks: goal reached)",
    "invalid": "the episode ended on a move the game could not parse (after format retries)",
    "turns": "policy turns played",
    "score": "text: PAPRIKA's score, LOWER is better: turns used, a failure counting as the turn limit (bandit "
             "tasks: minus the total reward); pairs rank trajectories by it. NetHack: best in-game score seen",
    "reward": "text: the environment's summed reward over the episode (what bandit tasks are scored by; higher is "
              "better). NetHack steps: task reward of the action that led to this observation",
    "format_retries": "times the policy was asked again because its reply had no parsable action",
    "seed": "seed the episode was played with (derived from the global seed, stage and chunk)",
    "policy": "which policy played (base / sft / dpo / rl, a NetHack agent, or a path)",
    "label": "judge's verdict on the trajectory (text annotate) or ONI message label",
    # NetHack steps / episodes (pipeline/nethack/play.py)
    "episode": "global episode index",
    "step": "step within the episode; 0 = the observation after reset",
    "action": "action that led to this observation (-1 at step 0)",
    "message": "decoded NLE game message of this observation ('' = none)",
    "blstats": "NLE bottom-line statistics vector of this observation",
    "done": "the episode ended at this step",
    "return": "sum of task rewards of the episode",
    "depth": "deepest dungeon level reached",
    "length": "steps in the episode",
    "end_status": "NLE StepStatus: -1 aborted (step cap), 1 death, 2 task success",
    # preference pairs
    "caption_first": "first message of a Motif caption pair",
    "caption_second": "second message of a Motif caption pair",
    "episode_first": "episode the first caption came from",
    "episode_second": "episode the second caption came from",
    "step_first": "step of the first caption",
    "step_second": "step of the second caption",
    "y": "preference: 1 = first preferred, 0 = second, 0.5 = tie",
    "raw": "the annotator's raw answer",
    "pair": "index of the preference pair",
    "prompt": "chat prompt shared by chosen and rejected",
    "chosen": "preferred continuation",
    "rejected": "dispreferred continuation",
    "ref_chosen_logps": "reference policy's summed log-probability of chosen (DPO, computed once)",
    "ref_rejected_logps": "reference policy's summed log-probability of rejected",
    # train-dpo's scores of the pairs (stages/train_dpo.py)
    "policy_chosen_logps": "the DPO-trained policy's summed log-probability of chosen (assistant tokens)",
    "policy_rejected_logps": "the DPO-trained policy's summed log-probability of rejected",
    "implicit_margin": "DPO's implicit reward margin: beta * ((policy - ref log-prob of chosen) - (policy - ref "
                       "log-prob of rejected))",
    "prefers_chosen": "the implicit reward ranks chosen above rejected (implicit_margin > 0)",
    "tty_chars": "NLE's terminal of this observation: 24 x 80 characters, row by row",
    # what an annotation's LLM requests cost (pipeline.llm.ledger.Usage), in the run that wrote the row
    "judge_label": "the judge's verdict: VALID / NOTVALID / UNKNOWN",
    "judge_raw": "the judge's raw answer (or the request's failure)",
    "attempts": "sends to the LLM backend for this row, its retries included (0: no request of its own)",
    "judge_attempts": "sends to the judge's backend for this row, its retries included (0: no request of its own)",
    "cached": "answered without a send (response cache, or the same request in the batch); null: no LLM request",
    "judge_cached": "the verdict came without a send (response cache, or the same request in the batch); null: no "
                    "LLM request",
    "tokens_in": "prompt tokens of this row's sends (0 when cached)",
    "tokens_out": "generated tokens of this row's sends (0 when cached)",
    "judge_tokens_in": "prompt tokens of the judge's sends for this row (0 when cached)",
    "judge_tokens_out": "generated tokens of the judge's sends for this row (0 when cached)",
}


def datasets_under(path: Path) -> list[Path]:
    """Complete chunked datasets at ``path`` or one directory below it."""
    if not path.is_dir():
        return []
    found = [path] if (read_manifest(path) or {}).get("complete") else []
    return found + [p for p in sorted(path.iterdir()) if p.is_dir() and (read_manifest(p) or {}).get("complete")]


def card(path: Path, stage: str) -> str:
    manifest = read_manifest(path) or {}
    parts = [p["file"] for _, p in sorted(manifest.get("parts", {}).items())]
    schema = pq.read_schema(path / parts[0]) if parts else None
    rows = "\n".join(f"| `{f.name}` | {f.type} | {COLUMNS.get(f.name, '(not documented yet)')} |"
                     for f in (schema or []))
    upstream = "\n".join(f"- {k}: `{v}`" for k, v in manifest.get("upstream", {}).items()) or "- (none)"
    return (f"# {path.name}\n\nWritten by stage `{stage}`: {manifest.get('rows', 0)} rows in {len(parts)} Parquet "
            f"parts (`part-*.parquet`, read them in order, e.g. `pipeline.core.artifacts.read_rows`); `_manifest.json` "
            f"holds each part's sha256.\n\n- params hash: `{manifest.get('params_hash')}`\n\n## Upstream\n\n"
            f"{upstream}\n\n## Columns\n\n| column | type | meaning |\n|---|---|---|\n{rows}\n")


def write_cards(outs: list[Path], stage: str) -> list[Path]:
    written = []
    for out in outs:
        for ds in datasets_under(out):
            atomic_write_bytes(ds / "README.md", card(ds, stage).encode())
            written.append(ds / "README.md")
    return written
