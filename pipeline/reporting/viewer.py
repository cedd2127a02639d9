"""Offline viewer pages: one self-contained HTML file per dataset a stage wrote, linked from ``data/report.html``.

``curio report`` (and the report stage) writes ``report_pages/STAGE.html`` beside the report for every dataset
present: text episodes (rollout-text, evaluate-text, rl-text), preference pairs (pairs-text, with reflogprobs'
reference log-probabilities and train-dpo's implicit reward margins when present), annotations (annotate-text,
annotate-utterances, annotate-nethack, with each row's attempts, cache hit and tokens) and NetHack episodes
(rollout-nethack replays of the tty frames; evaluate-nethack's per-episode summaries with the replays it kept).
Each page embeds its rows as JSON with its own script and style: no server, no network, nothing fetched.

A page holds at most ``ROW_CAP[kind]`` rows: above that, an evenly spaced sample (rows ``⌊i·n/cap⌋``, the same
every time) that the page says it is, with the line that opens the full dataset with ``datasets``. Long texts are
cut at ``TEXT_CAP`` characters (marked). Pages are byte-deterministic: no timestamps, no random ids, sorted keys.
State lives in the URL fragment (``#group=wordle&policy=base&sort=-turns&row=3&step=12``), so a link opens one
episode at one step, and a test can drive a page without clicking.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.core.artifacts import atomic_write_bytes, dataset_hash, part_files, read_manifest
from pipeline.core.samples import clean, frame_text, sample_indices
from pipeline.models.reward_net_config import MOTIF_COUNT_EXPONENT

PAGES_DIR = "report_pages"  # beside report.html
TEXT_CAP = 4000  # characters of one message / raw reply kept on a page
ROW_CAP = {"episodes": 1500, "pairs": 1000, "annotations-text": 1000, "annotations-utterances": 1000,
           "annotations-nethack": 3000,
           "nethack-steps": 12, "nethack-episodes": 5000}  # nethack-steps: episodes (of NLE steps each)
STEP_CAP = 2000  # steps of one NetHack episode replayed on a page
KEYFRAME = 64  # a full tty frame every KEYFRAME steps, changed runs of characters in between
COUNT_EXPONENT = MOTIF_COUNT_EXPONENT  # β of r̃(m) / N_ep(m)^β (pipeline.nethack.intrinsic), rl_nethack's default
MARGINS = "train_policy/dpo_margins"  # train-dpo's scores of the pairs of data/reflogprobs
REPLAYS = "evaluate_nethack_replays"  # evaluate-nethack's recorded steps
USAGE = ("attempts", "cached", "tokens_in", "tokens_out")  # an annotation's cost (pipeline.llm.ledger.Usage)


@dataclass(frozen=True)
class PageSpec:
    stage: str
    kind: str
    datasets: tuple[str, ...]  # under data_dir; the first complete one is shown
    about: str


PAGES: list[PageSpec] = [
    PageSpec("rollout-text", "episodes", ("rollout_text",), "episodes the base policy played (training data)"),
    PageSpec("annotate-text", "annotations-text", ("annotate_text",), "the judge's verdict on every trajectory"),
    PageSpec("annotate-utterances", "annotations-utterances", ("annotate_utterances",),
             "pairs of moves and the move the judge prefers (rl_text.reward: motif)"),
    PageSpec("pairs-text", "pairs", ("reflogprobs", "pairs_text/preferences"), "preference pairs"),
    PageSpec("rl-text", "episodes", ("rl_text/rollouts", "rl_text/replay"), "episodes played during RL"),
    PageSpec("evaluate-text", "episodes", ("evaluate_text",), "held-out and train evaluation episodes"),
    PageSpec("rollout-nethack", "nethack-steps", ("rollout_nethack",), "NetHack rollouts, step by step"),
    PageSpec("annotate-nethack", "annotations-nethack", ("annotate_nethack",), "caption pairs and their labels"),
    PageSpec("evaluate-nethack", "nethack-episodes", ("evaluate_nethack",), "NetHack evaluation episodes"),
]


# -- sampling ---------------------------------------------------------------------------------------------
def _parts(path: Path) -> list[tuple[Path, int]]:
    """(verified part file, rows) in order (``part_files`` checks each against the manifest)."""
    manifest = read_manifest(path) or {}
    counts = [p["rows"] for _, p in sorted(manifest.get("parts", {}).items())]
    return list(zip(map(Path, part_files(path)), counts, strict=True))


def sample_table(path: Path, cap: int, columns: list[str] | None = None) -> tuple[pa.Table, int]:
    """(the rows ``sample_indices(n, cap)`` of a dataset, n): each part read once and only its picked rows kept."""
    parts = _parts(path)
    n = sum(rows for _, rows in parts)
    picked = np.asarray(sample_indices(n, cap), dtype=np.int64)
    pieces, offset = [], 0
    for file, rows in parts:
        local = picked[(picked >= offset) & (picked < offset + rows)] - offset
        if len(local):
            pieces.append(pq.read_table(file, columns=columns).take(pa.array(local)))
        offset += rows
    return (pa.concat_tables(pieces, promote_options="default") if pieces else pa.table({})), n


def _cut(text: Any) -> Any:
    if isinstance(text, str) and len(text) > TEXT_CAP:
        return text[:TEXT_CAP] + f" … [cut: {len(text) - TEXT_CAP} more characters in the dataset]"
    return text


def _messages(conv: list[dict] | None) -> list[dict]:
    return [{"role": m["role"], "content": _cut(m["content"])} for m in conv or []]


# -- per-kind rows ------------------------------------------------------------------------------------------
def _actions(conv: list[dict]) -> list[str | None]:
    """The parsed action of every assistant message (None for others or none parsable)."""
    from pipeline.envs.base import extract_answer

    return [extract_answer(m["content"]) if m["role"] == "assistant" else None for m in conv]


def _outcome(r: dict) -> str:
    return "invalid" if r.get("invalid") else "success" if r.get("success") else "failure"


def episode_rows(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        conv = r.get("conversation") or []
        row = {k: clean(r.get(k)) for k in ("group", "task_id", "category", "difficulty", "split", "sample",
                                             "policy", "turns", "score", "reward", "format_retries", "seed")}
        row.update(outcome=_outcome(r), final_action=r.get("final_action"), secret=_cut(r.get("secret")),
                   conversation=_messages(conv), actions=_actions(conv))
        if "turn_rewards" in r:
            row["turn_rewards"] = [clean(x) for x in r["turn_rewards"]]
        if "judge_label" in r:
            row.update(judge_label=r["judge_label"], judge_raw=_cut(r.get("judge_raw")))
        out.append(row)
    return out


def transitions_to_episodes(table: pa.Table) -> list[dict]:
    """ArCHer's per-turn transitions (pipeline/rl_text/archer.py) as episodes: the last state, a reward per turn."""
    keys = ("round", "group", "task_id", "sample")
    episodes: dict[tuple, dict] = {}
    for t in table.to_pylist():
        ep = episodes.setdefault(tuple(t[k] for k in keys), {**{k: t[k] for k in keys}, "split": "train",
                                                              "policy": f"rl (round {t['round']})", "rewards": {}})
        ep["rewards"][t["turn"]] = t["reward"]
        if t["turn"] >= ep.get("last_turn", -1):
            ep["last_turn"] = t["turn"]
            ep["conversation"] = t["next_state"] or [*t["state"], {"role": "assistant", "content": t["action"]}]
            ep["done"] = t["done"]
    rows = []
    for ep in episodes.values():
        turns = [ep["rewards"][k] for k in sorted(ep["rewards"])]
        rows.append({**ep, "turn_rewards": turns, "turns": len(turns), "reward": float(sum(turns)),
                     "success": bool(turns and turns[-1] > 0 and ep["done"]), "invalid": False})
    return rows


def pair_rows(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        row = {k: clean(r.get(k)) for k in ("group", "task_id", "state_turn", "candidates", "chosen_reward",
                                             "rejected_reward", "chosen_turns", "rejected_turns", "rejected_success")
               if k in r}
        row.update(prompt=_messages(r.get("prompt")), chosen=_messages(r.get("chosen")),
                   rejected=_messages(r.get("rejected")),
                   mean_rewards=[clean(x) for x in r.get("mean_rewards") or []])
        if r.get("ref_chosen_logps") is not None:
            c, j = float(r["ref_chosen_logps"]), float(r["ref_rejected_logps"])
            row.update(ref_chosen_logps=c, ref_rejected_logps=j, ref_margin=c - j)
        out.append(row)
    return out


def pair_margins(data_dir: Path, pairs: Path) -> dict[int, dict] | None:
    """train-dpo's scores of the pairs by pair index (their row in ``pairs``), when it scored these very pairs."""
    path = data_dir / MARGINS
    manifest = read_manifest(path) or {}
    if not manifest.get("complete") or manifest.get("upstream", {}).get("pairs") != dataset_hash(pairs):
        return None
    return {r.pop("pair"): r for r in sample_table(path, 1 << 62, ["pair", "policy_chosen_logps",
                                                                  "policy_rejected_logps", "implicit_margin",
                                                                  "prefers_chosen"])[0].to_pylist()}


def annotation_text_rows(rows: list[dict], llm_judge: bool) -> list[dict]:
    """Episodes with the judge's label and raw reply; the prompt an LLM judge is sent, rebuilt from the row
    (``pipeline.text.judge.judge_messages``, what the judge calls)."""
    from pipeline.text.judge import judge_messages

    out = episode_rows(rows)
    for row, r in zip(out, rows, strict=True):
        row["label"] = r.get("judge_label")
        if llm_judge:
            row["prompt_sent"] = _messages(judge_messages(r["secret"], r["category"], r["conversation"],
                                                          r["final_action"], r["success"]))
    return out


def annotation_nethack_rows(rows: list[dict], mode: str | None, goal: str, template: str, llm: bool) -> list[dict]:
    """Caption pairs with label and raw answer; the prompt a chat annotator is sent, rebuilt with its own builder
    (preferences: the pair's comparison; labels: one question per caption)."""
    from pipeline.nethack.annotation import message_label_messages, preference_messages

    out = []
    for r in rows:
        row = {k: clean(r.get(k)) for k in ("pair", "episode_first", "step_first", "caption_first",
                                             "episode_second", "step_second", "caption_second", "label")}
        row["raw"] = _cut(r.get("raw"))
        if llm and mode == "preferences":
            row["prompt_sent"] = _messages(preference_messages(r["caption_first"], r["caption_second"], goal,
                                                               template))
        elif llm and mode == "labels":
            row["prompt_sent"] = _messages([*message_label_messages(r["caption_first"], goal),
                                            *message_label_messages(r["caption_second"], goal)])
        out.append(row)
    return out


def annotation_utterance_rows(rows: list[dict]) -> list[dict]:
    """Move pairs (the same task and agent turn in two plays) with the judge's label and raw reply; each side's text
    is what the utterance reward model reads (the move, then its context, newest first)."""
    keys = ("pair", "group", "task_id", "turn", "sample_first", "sample_second", "move_first", "move_second", "label")
    return [{**{k: clean(r.get(k)) for k in keys}, "text_first": _cut(r.get("text_first")),
             "text_second": _cut(r.get("text_second")), "raw": _cut(r.get("raw"))} for r in rows]


def usage_of(r: dict, prefix: str = "") -> dict:
    """A row's annotation cost (``attempts``, ``cached``, ``tokens_in``, ``tokens_out``) under the page's names; empty
    for a dataset written before the stage kept it."""
    return {k: clean(r[prefix + k]) for k in USAGE if prefix + k in r}


def frame_deltas(frames: list[bytes]) -> list[Any]:
    """Frames as a full frame every ``KEYFRAME`` steps and, between, ``[[offset, text], …]`` of the runs of
    characters that changed since the previous frame (runs closer than 8 characters merged)."""
    out: list[Any] = []
    prev = None
    for i, f in enumerate(frames):
        cur = np.frombuffer(f, dtype=np.uint8)
        if prev is None or i % KEYFRAME == 0 or len(prev) != len(cur):
            out.append(frame_text(f))
        else:
            idx = np.flatnonzero(prev != cur)
            runs = []
            if len(idx):
                breaks = np.flatnonzero(np.diff(idx) > 8)
                starts = np.concatenate([[idx[0]], idx[breaks + 1]])
                ends = np.concatenate([idx[breaks], [idx[-1]]]) + 1
                runs = [[int(s), frame_text(f[s:e])] for s, e in zip(starts, ends, strict=True)]
            out.append(runs)
        prev = cur
    return out


def episode_frames(path: Path, episodes: list[int], policy: str | None = None) -> dict[tuple[int, int], bytes]:
    """``{(episode, step): tty_chars}`` of the first ``STEP_CAP`` steps of ``episodes`` (of ``policy``'s, in a dataset
    of several policies' steps; read part by part: the frames of the other episodes are never kept)."""
    out: dict[tuple[int, int], bytes] = {}
    for file, _ in _parts(path):
        t = pq.read_table(file, columns=["episode", "step", "tty_chars", *(["policy"] if policy is not None else [])])
        keep = pc.and_(pc.is_in(t["episode"], pa.array(episodes, pa.int32())), pc.less(t["step"], STEP_CAP))
        t = t.filter(keep if policy is None else pc.and_(keep, pc.equal(t["policy"], policy)))
        out.update(zip(zip(t["episode"].to_pylist(), t["step"].to_pylist(), strict=True), t["tty_chars"].to_pylist(),
                       strict=True))
    return out


def nethack_step_episodes(table: pa.Table, episodes: list[int], r_tilde: dict[str, float] | None,
                          frames: dict[tuple[int, int], bytes]) -> list[dict]:
    """One entry per chosen episode: its first ``STEP_CAP`` steps with message, action, extrinsic reward, the
    reward model's r̃(message) and the episodic intrinsic reward r̃ / N_ep(m)^β (no threshold), and the frames."""
    ep_col = table["episode"].to_numpy()
    out = []
    for e in episodes:
        idx = np.flatnonzero(ep_col == e)
        total = len(idx)
        rows = table.take(pa.array(idx[:STEP_CAP])).to_pylist()
        counts: dict[str, int] = {}
        intrinsic, rt = [], []
        for r in rows:
            m = r["message"]
            counts[m] = counts.get(m, 0) + 1
            v = r_tilde.get(m) if r_tilde is not None else None
            rt.append(None if v is None else round(v, 4))
            intrinsic.append(None if v is None else round(v / counts[m] ** COUNT_EXPONENT, 4))
        shown = [frames.get((int(e), r["step"])) for r in rows]
        out.append({"episode": int(e), "steps": total, "shown": len(rows),
                    "return": round(float(sum(r["reward"] for r in table.take(pa.array(idx)).select(["reward"])
                                              .to_pylist())), 4),
                    "action": [r["action"] for r in rows], "reward": [round(float(r["reward"]), 4) for r in rows],
                    "message": [r["message"] for r in rows], "r_tilde": rt, "intrinsic": intrinsic,
                    "frames": frame_deltas(shown) if shown and None not in shown else None})
    return out


# -- pages --------------------------------------------------------------------------------------------------
def complete_dataset(data_dir: Path, spec: PageSpec) -> Path | None:
    for name in spec.datasets:
        path = data_dir / name
        if (read_manifest(path) or {}).get("complete"):
            return path
    return None


def load_snippet(path: Path) -> str:
    return (f'import datasets\nds = datasets.load_dataset("parquet", data_files="{path}/part-*.parquet", '
            f'split="train")')


@dataclass
class _Page:
    """A page being built: its dataset and params, and the columns, filters and notes a builder adds to; ``total`` /
    ``shown``: the rows (NetHack steps: episodes) the dataset holds and the page shows."""

    spec: PageSpec
    path: Path
    data_dir: Path
    params: Any
    columns: list[str]
    filters: list[str]
    notes: list[str] = field(default_factory=list)
    total: int = 0
    shown: int = 0


def page_data(spec: PageSpec, path: Path, data_dir: Path, params: Any = None) -> dict:
    """What one page embeds: its rows (sampled), the filters, the notes (the kind's builder in ``PAGE_BUILDERS``)."""
    kind = spec.kind
    page = _Page(spec, path, data_dir, params, list(COLUMNS_SHOWN[kind]), list(FILTERS[kind]))
    rows = PAGE_BUILDERS[kind](page)
    return {"kind": kind, "stage": spec.stage, "about": spec.about, "dataset": str(path), "rows": rows,
            "total": page.total, "shown": page.shown, "notes": page.notes, "load": load_snippet(path),
            "filters": page.filters, "columns": page.columns}


def _nethack_steps_page(page: _Page) -> list[dict]:
    """rollout-nethack's steps as episodes replayed step by step (a sample of whole episodes)."""
    path, kind = page.path, page.spec.kind
    has_frames = "tty_chars" in pq.read_schema(_parts(path)[0][0]).names
    table, _ = sample_table(path, 1 << 62, ["episode", "step", "action", "reward", "message"])
    n = table.num_rows
    episodes = sorted(set(table["episode"].to_pylist()))
    chosen = [episodes[i] for i in sample_indices(len(episodes), ROW_CAP[kind])]
    r_tilde = message_rewards(page.data_dir)
    rows = nethack_step_episodes(table, chosen, r_tilde, episode_frames(path, chosen) if has_frames else {})
    page.total, page.shown = len(episodes), len(chosen)
    page.notes.append(f"{n} steps of {page.total} episodes; the page replays {page.shown} of them (evenly spaced "
                      f"episode indices), each up to its first {STEP_CAP} steps.")
    if not has_frames:
        page.notes.append("This dataset has no tty_chars column (written before rollout-nethack stored frames): "
                          "messages and rewards only; rerun rollout-nethack for the replay.")
    page.notes.append(INTRINSIC_NOTE if r_tilde is not None else NO_INTRINSIC_NOTE)
    return rows


def _sampled(build: Callable[[_Page, list[dict], int], list[dict]]) -> Callable[[_Page], list[dict]]:
    """A page of a sample of a dataset's rows (``ROW_CAP[kind]``) that ``build`` turns into the page's rows; the
    first note says how they were sampled."""

    def builder(page: _Page) -> list[dict]:
        path, kind = page.path, page.spec.kind
        if "state" in pq.read_schema(_parts(path)[0][0]).names:  # ArCHer's transitions: whole episodes sampled
            every = transitions_to_episodes(sample_table(path, 1 << 62)[0])
            raw = [every[i] for i in sample_indices(len(every), ROW_CAP[kind])]
            n, shown = len(every), len(raw)
            page.notes.append("Episodes rebuilt from ArCHer's per-turn transitions (its replay buffer): turn rewards "
                              "as stored; rows below are episodes, not transitions.")
        else:
            sub, n = sample_table(path, ROW_CAP[kind])
            raw, shown = sub.to_pylist(), sub.num_rows
        page.total, page.shown = n, shown
        rows = build(page, raw, n)
        if shown < n:
            page.notes.insert(0, f"Showing {shown} of {n} rows: an evenly spaced sample (rows ⌊i·{n}/{shown}⌋), the "
                                 "same each time the report is written.")
        else:
            page.notes.insert(0, f"All {n} rows.")
        return rows

    return builder


def _episodes_page(page: _Page, raw: list[dict], n: int) -> list[dict]:
    return episode_rows(raw)


def _pairs_page(page: _Page, raw: list[dict], n: int) -> list[dict]:
    """Preference pairs, with reflogprobs' reference log-probs and train-dpo's margins when they scored these."""
    rows = pair_rows(raw)
    paprika = bool(raw) and "chosen_turns" in raw[0]
    if paprika:
        page.columns = ["group", "task_id", "chosen_turns", "rejected_turns", "rejected_success"]
    reflogprobs = page.path.name == "reflogprobs"
    margins = pair_margins(page.data_dir, page.path) if reflogprobs else None
    if rows and "ref_margin" in rows[0]:
        page.columns.append("ref_margin")
    if margins is not None:
        for row, i in zip(rows, sample_indices(n, ROW_CAP[page.spec.kind]), strict=True):  # the rows sampled
            row.update(pair=i, **margins.get(i, {}))
        page.columns[2:2] = ["implicit_margin", "prefers_chosen"]  # beside the pair's name: in view
        page.filters.append("prefers_chosen")
    page.notes.append(("Shared prefix: the prompt both trajectories start from. PAPRIKA pairs of whole "
                       "trajectories: the chosen one succeeded within turn_threshold turns of the task's best, "
                       "the rejected one failed or took longer; the turns each used (and whether the rejected one "
                       "succeeded) made the pair." if paprika else
                       "Shared prefix: the prompt both continuations start from. Scores: the mean reward of "
                       "each candidate turn (its judged continuations) that made the pair.")
                      + (" Reference log-probs: summed over the assistant turn's tokens (reflogprobs); "
                         "ref margin = chosen − rejected." if reflogprobs else
                         " Reference log-probs appear once reflogprobs has run.")
                      + (f" Implicit reward margin: β·[(log π − log π_ref)(chosen) − (log π − log π_ref)"
                         f"(rejected)] of the policy train-dpo trained{_beta(page.params)}, log-probs summed as "
                         f"reflogprobs sums them ({MARGINS}); prefers_chosen: the margin is > 0."
                         if margins is not None else
                         " The trained policy's implicit reward margin appears once train-dpo has run."))
    return rows


def _llm_judge(params: Any, section: str) -> bool:
    judge = getattr(getattr(params, section, None), "judge", None)
    return judge is not None and getattr(judge, "backend", "rules") != "rules"


def _text_annotations_page(page: _Page, raw: list[dict], n: int) -> list[dict]:
    llm = _llm_judge(page.params, "annotate_text")
    rows = annotation_text_rows(raw, llm)
    for row, r in zip(rows, raw, strict=True):
        row.update(usage_of(r, "judge_"))
    page.notes.append("Prompt sent: rebuilt from the row with the judge's own prompt builder."
                      if llm else "Judge: the rules check (the game's program, exact match of the final guess): "
                      "no prompt is sent.")
    return _with_usage(page, rows)


def _utterance_annotations_page(page: _Page, raw: list[dict], n: int) -> list[dict]:
    llm = _llm_judge(page.params, "annotate_utterances")
    rows = annotation_utterance_rows(raw)
    for row, r in zip(rows, raw, strict=True):
        row.update(usage_of(r))
    page.notes.append("Judge: a chat model, asked with pipeline/text/prompts/utterance_preference.yaml about the "
                      "two moves in their conversations (the prompt needs the rollout rows, so it is not rebuilt "
                      "here); its raw reply is shown." if llm else
                      "Judge: the rules check (the larger one-turn reward from the game's knowledge base; TIE "
                      "when equal): no prompt is sent.")
    return _with_usage(page, rows)


def _nethack_annotations_page(page: _Page, raw: list[dict], n: int) -> list[dict]:
    cfg = getattr(page.params, "annotate_nethack", None)
    mode = getattr(cfg, "mode", None)
    backend = getattr(getattr(cfg, "annotator", None), "backend", "embedding")
    llm = backend != "embedding"
    rows = annotation_nethack_rows(raw, mode, getattr(cfg, "goal", "defaultgoal"), getattr(cfg, "template", "default"),
                                   llm)
    for row, r in zip(rows, raw, strict=True):
        row.update(usage_of(r))
    page.notes.append(f"Prompt sent: rebuilt with the annotator's own prompt builder ({mode} mode)." if llm else
                      "Annotator: the embedding model (the caption closer to the goal text wins; no LLM, no "
                      "prompt): the raw reply holds both similarities.")
    return _with_usage(page, rows)


def _with_usage(page: _Page, rows: list[dict]) -> list[dict]:
    """An annotation page's cost columns, or a note saying its dataset has none."""
    if rows and "attempts" in rows[0]:
        page.columns += list(USAGE)
        page.filters.append("cached")
        page.notes.append(USAGE_NOTE)
    elif rows:
        page.notes.append(f"This dataset has no per-row cost columns (written before {page.spec.stage} kept them): "
                          f"rerun {page.spec.stage} for them; the report's LLM ledger has the stage's totals.")
    return rows


def _nethack_episodes_page(page: _Page, raw: list[dict], n: int) -> list[dict]:
    rows = [{k: clean(v) for k, v in r.items()} for r in raw]
    page.notes.append(attach_replays(rows, page.data_dir))
    page.columns.append("replayed")
    page.filters.append("replayed")
    return rows


#: A page's builder by dataset kind: its rows, and the columns, filters and notes it adds.
PAGE_BUILDERS: dict[str, Callable[[_Page], list[dict]]] = {
    "episodes": _sampled(_episodes_page),
    "pairs": _sampled(_pairs_page),
    "annotations-text": _sampled(_text_annotations_page),
    "annotations-utterances": _sampled(_utterance_annotations_page),
    "annotations-nethack": _sampled(_nethack_annotations_page),
    "nethack-steps": _nethack_steps_page,
    "nethack-episodes": _sampled(_nethack_episodes_page),
}


INTRINSIC_NOTE = ("Intrinsic reward: r̃(m), the trained reward model's normalised output for the step's message "
                  f"(data/reward_model/message_rewards.json), and r̃(m) / N_ep(m)^{COUNT_EXPONENT:g}, its count-decayed "
                  "episodic value "
                  "without a threshold (pipeline/nethack/intrinsic.py); extrinsic: the task reward.")
NO_INTRINSIC_NOTE = "Intrinsic reward: not shown (no data/reward_model/message_rewards.json yet: run train-reward)."
USAGE_NOTE = ("Cost per row, as the stage's LLM ledger counts it (its rows sum to the ledger of the run that wrote "
              "them): attempts = sends to the backend, its retries and a retry turn included (0: none of its own); "
              "cached = answered without a send (the response cache, or the same request in the same batch: paid "
              "nothing), empty when no LLM was asked (a program, the embedding model, a rule); tokens in / out of "
              "the sends.")


def _beta(params: Any) -> str:
    beta = getattr(getattr(getattr(params, "train_policy", None), "dpo", None), "beta", None)
    return f" (β = {beta})" if beta is not None else ""


def message_rewards(data_dir: Path) -> dict[str, float] | None:
    """train-reward's r̃ of every message it scored, if it has run."""
    path = data_dir / "reward_model" / "message_rewards.json"
    return json.loads(path.read_text()) if path.exists() else None


def attach_replays(rows: list[dict], data_dir: Path) -> str:
    """Give the evaluation episodes evaluate-nethack kept the steps of (``data/evaluate_nethack_replays``) their
    replay (``row["replay"]``, at most ``ROW_CAP["nethack-steps"]`` of them); returns the page's note on them."""
    path = data_dir / REPLAYS
    for row in rows:
        row["replayed"] = "no"
    manifest = read_manifest(path) or {}
    if not manifest.get("complete") or not manifest.get("rows"):
        return ("No replays: evaluate-nethack wrote none (evaluate_nethack.replay_episodes = 0, or a dataset written "
                "before it kept them: rerun evaluate-nethack).")
    steps = sample_table(path, 1 << 62, ["policy", "episode", "step", "action", "reward", "message"])[0]
    shown = {(r["policy"], r["episode"]): r for r in rows}
    kept = sorted(set(zip(steps["policy"].to_pylist(), steps["episode"].to_pylist(), strict=True)) & set(shown))
    chosen = [kept[i] for i in sample_indices(len(kept), ROW_CAP["nethack-steps"])]
    r_tilde = message_rewards(data_dir)
    for policy in dict.fromkeys(p for p, _ in chosen):
        episodes = [e for p, e in chosen if p == policy]
        mine = steps.filter(pc.equal(steps["policy"], policy))
        for replay in nethack_step_episodes(mine, episodes, r_tilde, episode_frames(path, episodes, policy)):
            row = shown[(policy, replay["episode"])]
            row.update(replayed="yes", replay=replay)
    return (f"Replays: {len(chosen)} of the {len(kept)} episodes evaluate-nethack kept every step of ({REPLAYS}: "
            "each policy's first evaluate_nethack.replay_episodes episodes, the same seeds for every policy, so "
            f"the agents can be compared on one game), each up to its first {STEP_CAP} steps; filter replayed = yes. "
            + (INTRINSIC_NOTE if r_tilde is not None else NO_INTRINSIC_NOTE))


FILTERS: dict[str, list[str]] = {
    "episodes": ["group", "policy", "split", "outcome", "difficulty"],
    "annotations-text": ["group", "policy", "split", "outcome", "label"],
    "pairs": ["group"],
    "annotations-utterances": ["group", "label"],
    "annotations-nethack": ["label"],
    "nethack-steps": [],
    "nethack-episodes": ["policy", "end_status"],
}
COLUMNS_SHOWN: dict[str, list[str]] = {
    "episodes": ["group", "task_id", "policy", "split", "outcome", "turns", "score"],
    "annotations-text": ["group", "task_id", "policy", "outcome", "label"],
    "pairs": ["group", "task_id", "state_turn", "chosen_reward", "rejected_reward"],
    "annotations-utterances": ["group", "task_id", "turn", "move_first", "move_second", "label"],
    "annotations-nethack": ["pair", "caption_first", "caption_second", "label"],
    "nethack-steps": ["episode", "steps", "return"],
    "nethack-episodes": ["policy", "episode", "return", "score", "depth", "length", "end_status"],
}


def _json_for_script(obj: Any) -> str:
    """JSON safe inside <script>: '<' escaped, so no '</script>' or '<!--' in the data ends the element."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def render_page(data: dict, report: str = "report.html") -> str:
    title = f"{data['stage']}: {data['about']}"
    notes = "".join(f"<p class='note'>{html.escape(n)}</p>" for n in data["notes"])
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><header><a href='../{html.escape(report)}'>← report</a>"
            f"<h1>{html.escape(title)}</h1><p class='note'>Dataset <code>{html.escape(data['dataset'])}</code>."
            f"</p>{notes}<details><summary>Open the full dataset</summary><pre>{html.escape(data['load'])}</pre>"
            f"</details></header><div id='filters'></div><div id='main'><div id='list'></div>"
            f"<div id='detail'></div></div>"
            f"<script type='application/json' id='data'>{_json_for_script(data)}</script>"
            f"<script>{SCRIPT}</script></body></html>\n")


def write_pages(data_dir: Path, out_dir: Path, params: Any = None, report: str = "report.html",
                progress: Callable[[str], None] | None = None) -> dict[str, tuple[Path, Path, int]]:
    """Write one page per stage whose dataset is complete; returns ``{stage: (page, dataset, rows)}``. Pages of
    datasets no longer present are removed, so the directory matches the report's links."""
    written: dict[str, tuple[Path, Path, int]] = {}
    for spec in PAGES:
        path = complete_dataset(data_dir, spec)
        if path is None:
            continue
        page = out_dir / f"{spec.stage}.html"
        atomic_write_bytes(page, render_page(page_data(spec, path, data_dir, params), report).encode())
        written[spec.stage] = (page, path, int((read_manifest(path) or {}).get("rows", 0)))
        if progress:
            progress(spec.stage)
    if out_dir.is_dir():
        for old in out_dir.glob("*.html"):
            if old.stem not in written and re.fullmatch(r"[\w-]+", old.stem):
                old.unlink()
    return written


ASSETS = Path(__file__).parent / "viewer_assets"  # the page's style and script, inlined into every page
STYLE = (ASSETS / "viewer.css").read_text()
SCRIPT = f"const KEYFRAME={KEYFRAME};\n" + (ASSETS / "viewer.js").read_text()
