"""The report's offline dataset pages (pipeline/reporting/viewer.py) and its deeper tables
(pipeline/reporting/breakdown.py).

The browser test opens every page kind in headless Chromium, drives a filter and a replay step through the URL
fragment (the pages keep their state there), reads the result from the DOM, and checks from Chromium's network
log that no request left the machine.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import curio, make_project

from pipeline.core.artifacts import dataset_hash
from pipeline.core.runners import run_chunked
from pipeline.core.samples import log_samples, sample_indices
from pipeline.nethack.play import EPISODE_SCHEMA as NETHACK_EPISODE_SCHEMA
from pipeline.nethack.play import FRAME_STEP_SCHEMA, REPLAY_STEP_SCHEMA, TTY_SIZE
from pipeline.reporting.breakdown import paired_difference, paired_rows, success_by, task_means
from pipeline.reporting.viewer import KEYFRAME, frame_deltas
from pipeline.text.multiturn_pairs import MULTITURN_PAIR_SCHEMA
from pipeline.text.play import EPISODE_SCHEMA

SHOTS_ENV = "CURIO_SCREENSHOTS"  # a directory to keep the page screenshots in (default: the test's tmp dir)


# -- formulas on numbers checkable by hand -------------------------------------------------------------------
def test_paired_difference_by_hand():
    policy = {"t1": 1.0, "t2": 0.5, "t3": 0.0}
    base = {"t1": 0.0, "t2": 0.5, "t3": 0.0, "t4": 1.0}  # t4: base only, left out of the pairing
    d, se, n = paired_difference(policy, base)
    # d = [1, 0, 0]: mean 1/3; sum of squares (2/3)² + 2·(1/3)² = 6/9; SE = sqrt((6/9) / (3·2)) = 1/3
    assert n == 3 and d == pytest.approx(1 / 3) and se == pytest.approx(1 / 3)
    d, se, n = paired_difference({"a": 1.0}, {"a": 0.0})
    assert (d, n) == (1.0, 1) and math.isnan(se)  # one task: no spread to estimate


def test_task_means_success_by_and_paired_rows():
    rows = [
        # base: task a won 1 of 2 samples, task b 0 of 2; sft: a 2 of 2, b 1 of 2
        *({"policy": "base", "group": "g", "task_id": t, "success": s, "difficulty": "easy"}
          for t, s in [("a", True), ("a", False), ("b", False), ("b", False)]),
        *({"policy": "sft", "group": "g", "task_id": t, "success": s, "difficulty": "hard" if t == "b" else "easy"}
          for t, s in [("a", True), ("a", True), ("b", True), ("b", False)]),
    ]
    means = task_means(rows)
    assert means == {"base": {("g", "a"): 0.5, ("g", "b"): 0.0}, "sft": {("g", "a"): 1.0, ("g", "b"): 0.5}}
    [[policy, d, se, n, z]] = paired_rows(rows)
    # d = [0.5, 0.5]: mean 0.5, no spread: SE 0 (z undefined)
    assert (policy, d, se, n) == ("sft", 0.5, 0.0, 2) and math.isnan(z)
    values, policies, cells = success_by(rows, "difficulty")
    assert values == ["easy", "hard"] and policies == ["base", "sft"]
    assert cells[("easy", "sft")] == (1.0, 0.0, 2)
    assert cells[("easy", "base")] == pytest.approx((0.25, math.sqrt(0.25 * 0.75 / 4), 4))


def test_sample_is_evenly_spaced_and_stable():
    assert sample_indices(5, 10) == [0, 1, 2, 3, 4]
    assert sample_indices(10, 4) == [0, 2, 5, 7]  # ⌊i·10/4⌋
    assert sample_indices(100_000, 1500) == sample_indices(100_000, 1500)
    assert len(set(sample_indices(100_000, 1500))) == 1500


def apply_deltas(deltas: list) -> list[str]:
    frames, cur = [], None
    for d in deltas:
        if isinstance(d, str):
            cur = list(d)
        else:
            for offset, text in d:
                cur[offset:offset + len(text)] = text
        frames.append("".join(cur))
    return frames


def moving_frames(n: int) -> list[bytes]:
    """An '@' walking along row 5 and a step counter in the message line."""
    frames = []
    for i in range(n):
        screen = np.full((24, 80), ord(" "), dtype=np.uint8)
        screen[0, :12] = np.frombuffer(f"step {i:06d}".ljust(12).encode(), dtype=np.uint8)
        screen[5, i % 80] = ord("@")
        screen[23, :8] = np.frombuffer(b"Dlvl:1  ", dtype=np.uint8)
        frames.append(screen.tobytes())
    return frames


def test_frame_deltas_rebuild_every_frame():
    frames = moving_frames(150)
    deltas = frame_deltas(frames)
    assert isinstance(deltas[0], str) and isinstance(deltas[KEYFRAME], str) and isinstance(deltas[1], list)
    assert apply_deltas(deltas) == [f.decode("latin-1") for f in frames]
    assert len(json.dumps(deltas[1])) < 60  # a step costs its changed runs, not a frame


# -- the pages in a browser ----------------------------------------------------------------------------------
def episode(i: int) -> dict:
    group = ["wordle", "twenty_questions"][i % 2]
    conv = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Guess a word."},
            {"role": "assistant", "content": f"Thinking. <Answer>crane{i}</Answer>"},
            {"role": "user", "content": "Feedback: ..X.. </script><b>not markup</b>"},
            {"role": "assistant", "content": "no tags here"}]
    return {"group": group, "task_id": f"t{i // 8}", "secret": json.dumps({"word": "crane"}), "category": "c",
            "difficulty": ["easy", "hard"][i % 3 == 0], "split": ["train", "eval"][i % 4 == 0], "sample": i % 4,
            "conversation": conv, "final_action": f"crane{i}", "success": i % 3 == 0, "invalid": i == 5,
            "turns": 2, "score": 2.0, "reward": 0.0, "format_retries": 0, "seed": i,
            "policy": "sft" if i % 8 == 4 else "base"}


def write(path: Path, rows: list[dict] | pa.Table, schema: pa.Schema | None = None) -> None:
    run_chunked(path, num_chunks=1, make_chunk=lambda _: rows, params_hash="h", schema=schema)


def write_datasets(data: Path) -> None:
    eps = [episode(i) for i in range(24)]
    write(data / "rollout_text", eps, EPISODE_SCHEMA)
    write(data / "evaluate_text", eps, EPISODE_SCHEMA)
    annotated = pa.Table.from_pylist(eps, EPISODE_SCHEMA)
    annotated = annotated.append_column("judge_label", pa.array(["VALID", "NOTVALID"] * 12))
    annotated = annotated.append_column("judge_raw", pa.array(["<VALID> ok"] * 24))
    # what each verdict cost: odd rows were sent (1 attempt, row 5 retried twice), even ones came from the cache
    for name, values in {"judge_attempts": [(3 if i == 5 else 1) if i % 2 else 0 for i in range(24)],
                         "judge_cached": [not i % 2 for i in range(24)],
                         "judge_tokens_in": [100 + i if i % 2 else 0 for i in range(24)],
                         "judge_tokens_out": [7 if i % 2 else 0 for i in range(24)]}.items():
        annotated = annotated.append_column(name, pa.array(values))
    write(data / "annotate_text", annotated)
    msgs = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Guess."}]
    pairs = [{"group": "wordle", "task_id": f"t{i}", "prompt": msgs,
              "chosen": [{"role": "assistant", "content": "<Answer>crane</Answer>"}],
              "rejected": [{"role": "assistant", "content": "<Answer>zzzzz</Answer>"}], "state_turn": 0,
              "candidates": 3, "chosen_reward": 0.75, "rejected_reward": 0.25, "mean_rewards": [0.75, 0.5, 0.25]}
             for i in range(5)]
    write(data / "pairs_text" / "preferences", pairs, MULTITURN_PAIR_SCHEMA)
    scored = [p | {"ref_chosen_logps": -4.5, "ref_rejected_logps": -7.25} for p in pairs]
    write(data / "reflogprobs", scored)
    # train-dpo's scores: pair i's implicit margin is 0.1 · ((c + 4.5) − (j + 7.25)), c and j by hand below
    chosen, rejected = [-4.0, -5.0, -3.0, -4.5, -6.0], [-8.0, -6.0, -9.25, -7.25, -7.0]
    margins = [{"pair": i, "group": "wordle", "task_id": f"t{i}", "policy_chosen_logps": c, "policy_rejected_logps": j,
                "implicit_margin": 0.1 * ((c + 4.5) - (j + 7.25)), "prefers_chosen": (c + 4.5) > (j + 7.25)}
               for i, (c, j) in enumerate(zip(chosen, rejected, strict=True))]
    run_chunked(data / "train_policy" / "dpo_margins", num_chunks=1, make_chunk=lambda _: margins, params_hash="h",
                upstream={"pairs": dataset_hash(data / "reflogprobs")})
    write(data / "annotate_nethack", [{"pair": i, "episode_first": 0, "step_first": i,
                                       "caption_first": "You see a newt.",
                                       "episode_second": 1, "step_second": i, "caption_second": "It's a wall.",
                                       "label": ["FIRST", "SECOND", "TIE"][i % 3], "raw": "similarity 0.1 / 0.2",
                                       "attempts": 0, "cached": None, "tokens_in": 0, "tokens_out": 0}
                                      for i in range(6)])
    # annotate-utterances: pair i asks "cat?" (first) against "dog?" (second) at agent turn 1 of task t{i % 2}
    write(data / "annotate_utterances", [{"pair": i, "group": "twenty_questions", "task_id": f"t{i % 2}", "turn": 1,
                                          "sample_first": 0, "sample_second": 1, "move_first": "Is it a cat?",
                                          "move_second": "Is it a dog?", "text_first": "Is it a cat?\n---\nNo.",
                                          "text_second": "Is it a dog?\n---\nNo.",
                                          "label": ["FIRST", "SECOND", "TIE"][i % 3], "raw": "exact 0.25 / 0.5",
                                          "attempts": 0, "cached": None, "tokens_in": 0, "tokens_out": 0}
                                         for i in range(6)])
    frames = moving_frames(40)
    steps = pa.table({"episode": pa.array([0] * 40, pa.int32()), "step": pa.array(range(40), pa.int32()),
                      "action": pa.array([-1] + [3] * 39, pa.int16()), "reward": pa.array([0.0] * 39 + [1.0],
                                                                                         pa.float32()),
                      "message": ["Hello Agent"] + ["You see a newt." if i % 10 == 0 else "" for i in range(1, 40)],
                      "blstats": pa.array([[0] * 27] * 40, pa.list_(pa.int32(), 27)),
                      "done": [False] * 39 + [True], "tty_chars": pa.array(frames, pa.binary(TTY_SIZE))},
                     schema=FRAME_STEP_SCHEMA)
    write(data / "rollout_nethack", steps, FRAME_STEP_SCHEMA)
    (data / "reward_model").mkdir()
    (data / "reward_model" / "message_rewards.json").write_text(json.dumps({"You see a newt.": 0.5, "": -0.1}))
    state = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Guess."}]
    turn0 = [*state, {"role": "assistant", "content": "<Answer>a</Answer>"}, {"role": "user", "content": "No."}]
    turn1 = [*turn0, {"role": "assistant", "content": "<Answer>b</Answer>"}, {"role": "user", "content": "Yes!"}]
    write(data / "rl_text" / "replay", [  # ArCHer's transitions: one episode of two turns
        {"group": "wordle", "task_id": "t0", "sample": 0, "turn": 0, "state": state, "action": "<Answer>a</Answer>",
         "reward": -0.25, "next_state": turn0, "done": False, "round": 0},
        {"group": "wordle", "task_id": "t0", "sample": 0, "turn": 1, "state": turn0, "action": "<Answer>b</Answer>",
         "reward": 1.0, "next_state": turn1, "done": True, "round": 0}])
    write(data / "evaluate_nethack", [{"policy": p, "episode": e, "seed": e, "return": 1.0 * e, "score": 3 * e,
                                       "depth": 1, "length": 100, "success": False, "end_status": 1}
                                      for p in ("random", "motif") for e in range(3)], NETHACK_EPISODE_SCHEMA)
    # evaluate-nethack kept every step of episode 1 of each policy (the '@' walks one column a step)
    replays = pa.concat_tables([steps.slice(0, 12).set_column(0, "episode", pa.array([1] * 12, pa.int32()))
                                .add_column(0, "policy", pa.array([p] * 12)) for p in ("random", "motif")])
    replays = replays.cast(REPLAY_STEP_SCHEMA)
    write(data / "evaluate_nethack_replays", replays, REPLAY_STEP_SCHEMA)


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--virtual-time-budget=3000"]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "chromium missing: `make browser` installs it (Debian package `chromium`)"
    return found


def dump_dom(page: Path, fragment: str, netlog: Path) -> str:
    """The DOM after the page's script ran with ``fragment`` as its URL fragment; fails if the page made any
    request."""
    res = subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--log-net-log={netlog}", "--dump-dom",
                          f"{page.as_uri()}#{fragment}"], capture_output=True, text=True, timeout=120, check=True)
    assert requests_made(netlog) == []
    return res.stdout


def screenshot(page: Path, fragment: str, shot: Path) -> None:
    shot.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--screenshot={shot}", "--window-size=1400,1000",
                    f"{page.as_uri()}#{fragment}"], capture_output=True, timeout=120, check=True)


def requests_made(netlog: Path) -> list[str]:
    """URLs a page asked Chromium's network stack for, from its net-log: the requests a page starts carry the
    page's origin as initiator; Chromium's own background requests (update and time checks) carry none."""
    log = json.loads(netlog.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return sorted({e["params"]["url"] for e in log.get("events", []) if e["type"] == start and "url" in e["params"]
                   and e["params"].get("initiator") != "not an origin"})


def test_the_network_check_sees_a_page_request(tmp_path):
    """The check the page tests rely on catches a page that loads anything (here an image from a closed port)."""
    page = tmp_path / "leaky.html"
    page.write_text("<!DOCTYPE html><html><body><img src='http://127.0.0.1:9/x.png'></body></html>")
    netlog = tmp_path / "net.json"
    subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--log-net-log={netlog}", "--dump-dom", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert requests_made(netlog) == ["http://127.0.0.1:9/x.png"]


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    project = make_project(tmp_path_factory.mktemp("viewer"), ["tracking.enabled=false"])
    write_datasets(project / "data")
    res = curio(["report"], cwd=project)
    report = Path(res.stdout.strip())
    html = report.read_text()
    found = dict(re.findall(r"<td>([\w-]+)</td><td><code>[^<]*</code></td><td>\d+</td><td><a href='([^']+)'>", html))
    return {stage: report.parent / href for stage, href in found.items()} | {"report": report}


def test_report_links_a_page_per_dataset_and_pages_are_deterministic(pages, tmp_path):
    assert set(pages) == {"report", "rollout-text", "evaluate-text", "annotate-text", "annotate-utterances",
                          "pairs-text", "rl-text", "rollout-nethack", "annotate-nethack", "evaluate-nethack"}
    html = pages["report"].read_text()
    assert "Stage figures" not in html
    assert "<h3>Success by difficulty</h3>" in html and "Each policy against base on the same tasks" in html
    # held-out (i % 4 == 0): base plays t0, t1, t2 as i = 0, 8, 16 (won only i = 0), sft as i = 4, 12, 20 (won 12):
    # d = [-1, 1, 0], d̄ = 0, SE = sqrt(2 / (3·2)) = 0.5774
    assert "<tr><td>sft</td><td>0</td><td>0.5774</td><td>3</td><td>0</td></tr>" in html
    for stage, page in pages.items():
        text = page.read_text()
        assert not re.search(r"""(src|href)=["']?(https?:)?//""", text), stage  # nothing fetched
        if stage != "report":
            assert "</script><b>" not in text  # data cannot end the script element
    before = {s: p.read_bytes() for s, p in pages.items()}
    project = pages["report"].parent.parent
    curio(["report"], cwd=project)
    assert {s: p.read_bytes() for s, p in pages.items()} == before  # byte for byte


def test_every_page_kind_renders_filters_and_replays_offline(pages, tmp_path):
    netlog = tmp_path / "net.json"
    # text episodes: a filter by group and outcome, read back from the DOM
    dom = dump_dom(pages["rollout-text"], "group=wordle&outcome=success", netlog)
    listed = re.findall(r'<tr data-i="(\d+)"', dom)
    expected = [i for i in range(24) if i % 2 == 0 and i % 3 == 0 and i != 5]  # wordle, successful
    assert [int(i) for i in listed] == expected
    assert f"{len(expected)} of 24 shown rows match" in dom
    assert "action: crane0" in dom and "no parsable action" in dom and "(environment reply)" in dom
    assert "&lt;/script&gt;&lt;b&gt;not markup" in dom  # the data's markup shown as text
    # per-turn rewards (rl-text's transitions rebuilt into an episode)
    dom = dump_dom(pages["rl-text"], "row=0", netlog)
    assert re.findall(r'<span class="reward">reward ([-\d.]+)</span>', dom) == ["-0.2500", "1"]
    assert "action: b" in dom and "Yes!" in dom and "<td>success</td>" in dom
    # a NetHack replay: step 7 shows the '@' in column 7 of row 5 and that step's message line
    dom = dump_dom(pages["rollout-nethack"], "row=0&step=7", netlog)
    screen = re.search(r'<pre id="screen">(.*?)</pre>', dom, re.S)[1].split("\n")
    assert screen[0].startswith("step 000007") and screen[5].index("@") == 7 and len(screen) == 24
    assert re.search(r'<b id="stepno">7</b>', dom)
    dom = dump_dom(pages["rollout-nethack"], "row=0&step=10", netlog)
    assert "You see a newt." in dom and "0.5" in dom  # the message and its r̃ (intrinsic beside extrinsic)
    # pairs: shared prefix, chosen and rejected side by side, the reference's and the trained policy's log-probs
    dom = dump_dom(pages["pairs-text"], "row=2", netlog)
    assert "shared prefix (2 messages)" in dom and "chosen · score 0.7500" in dom and "rejected · score 0.2500" in dom
    assert "ref log-prob -4.500 · trained log-prob -3</h3>" in dom  # pair 2: c = -3, j = -9.25
    # margin 0.1 · ((-3 + 4.5) − (-9.25 + 7.25)) = 0.1 · (1.5 + 2) = 0.35
    assert "<td>implicit reward margin</td><td>0.3500</td>" in dom
    assert "<td>implicit reward prefers chosen</td><td>true</td>" in dom
    # sorted by the margin, largest first (read back from the list)
    dom = dump_dom(pages["pairs-text"], "sort=-implicit_margin", netlog)
    margins = [0.1 * ((c + 4.5) - (j + 7.25)) for c, j in [(-4.0, -8.0), (-5.0, -6.0), (-3.0, -9.25), (-4.5, -7.25),
                                                             (-6.0, -7.0)]]
    assert [int(i) for i in re.findall(r'<tr data-i="(\d+)"', dom)] == sorted(range(5), key=lambda i: -margins[i])
    assert "implicit_margin ▼" in dom
    dom = dump_dom(pages["pairs-text"], "prefers_chosen=false", netlog)
    assert [int(i) for i in re.findall(r'<tr data-i="(\d+)"', dom)] == [i for i in range(5) if margins[i] <= 0]
    # annotations
    dom = dump_dom(pages["annotate-text"], "label=NOTVALID", netlog)
    assert set(re.findall(r'<tr data-i="(\d+)"', dom)) == {str(i) for i in range(1, 24, 2)}
    assert "rules check" in pages["annotate-text"].read_text()
    # each row's cost: attempts, cache hit, tokens; sortable and filterable like the other columns
    dom = dump_dom(pages["annotate-text"], "row=5", netlog)
    assert all(cell in dom for cell in ("<td>attempts</td><td>3</td>", "<td>cached</td><td>false</td>",
                                        "<td>tokens in</td><td>105</td>", "<td>tokens out</td><td>7</td>"))
    dom = dump_dom(pages["annotate-text"], "cached=false&sort=-tokens_in", netlog)
    assert [int(i) for i in re.findall(r'<tr data-i="(\d+)"', dom)] == list(range(23, 0, -2))
    assert "per stage, not per row" not in pages["annotate-text"].read_text()
    dom = dump_dom(pages["annotate-nethack"], "row=1", netlog)
    assert "It's a wall." in dom and "SECOND" in dom
    assert "<td>cached</td><td>no request</td>" in dom and "<td>attempts</td><td>0</td>" in dom  # the embedding model
    dom = dump_dom(pages["annotate-utterances"], "label=SECOND", netlog)
    assert re.findall(r'<tr data-i="(\d+)"', dom) == ["1", "4"]
    dom = dump_dom(pages["annotate-utterances"], "row=4", netlog)
    page = dom.split("<script")[0]
    assert "Is it a cat?" in page and "Is it a dog?" in page and "exact 0.25 / 0.5" in page
    assert "<td>agent turn</td><td>1</td>" in page and "<td>task</td><td>t0</td>" in page
    assert "rules check" in pages["annotate-utterances"].read_text()
    dom = dump_dom(pages["evaluate-nethack"], "policy=motif", netlog)
    assert len(re.findall(r'<tr data-i="\d+"', dom)) == 3
    # evaluate-nethack's replays: motif's episode 1 (row 4) at step 7, the '@' in column 7 of row 5
    dom = dump_dom(pages["evaluate-nethack"], "replayed=yes", netlog)
    assert re.findall(r'<tr data-i="(\d+)"', dom) == ["1", "4"]
    dom = dump_dom(pages["evaluate-nethack"], "row=4&step=7", netlog)
    screen = re.search(r'<pre id="screen">(.*?)</pre>', dom, re.S)[1].split("\n")
    assert screen[0].startswith("step 000007") and screen[5].index("@") == 7 and "<td>motif</td>" in dom
    assert "You see a newt." in dom and re.search(r'<b id="stepno">7</b>', dom)
    dom = dump_dom(pages["evaluate-nethack"], "row=0", netlog)
    page = dom.split("<script")[0]  # the rendered page, not the script's source
    assert "kept no steps of this episode" in page and 'id="screen"' not in page


def test_screenshots_of_each_page_kind(pages, tmp_path):
    """Screenshots (kept in $CURIO_SCREENSHOTS when set) are not blank."""
    import os

    from PIL import Image

    out = Path(os.environ.get(SHOTS_ENV) or tmp_path)
    for stage, fragment in [("rollout-text", "group=wordle&row=0"), ("pairs-text", "row=0"),
                            ("annotate-text", "row=1"), ("annotate-utterances", "row=0"),
                            ("annotate-nethack", "row=0"),
                            ("rollout-nethack", "row=0&step=10"), ("evaluate-nethack", ""), ("report", "")]:
        shot = out / f"test-{stage}.png"
        screenshot(pages[stage], fragment, shot)
        pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
        assert pixels.std() > 20, stage


# -- rollout-nethack's frames and MLflow tables --------------------------------------------------------------
def test_recorded_frames_are_the_terminal_nle_showed():
    from pipeline.nethack.play import EnvSpec, StepRecorder, play_random

    recorder = StepRecorder(frames=True)
    play_random(EnvSpec("score", max_episode_steps=30, frames=True), [0], [7], on_step=recorder.add)
    table = recorder.table()
    assert table.schema == FRAME_STEP_SCHEMA
    rows = table.to_pylist()
    for r in rows:
        screen = r["tty_chars"].decode("latin-1")
        assert len(screen) == TTY_SIZE
        assert screen[:80].strip() == r["message"].strip()[:80]  # the top line is the step's message
        assert "Dlvl:" in screen[22 * 80:] or r["done"]  # NLE's bottom lines (an ended game's may be blank)
    assert len({r["tty_chars"] for r in rows}) > 1  # the screen changes as the agent acts


def test_stage_runs_log_a_sample_of_each_dataset_as_a_table(pages):
    """What a stage's MLflow run logs (pipeline.reporting.viewer.log_samples), recorded from the Tracker's messages."""
    from pipeline.core.tracking import Tracker

    sent: list = []
    data = pages["report"].parent
    log_samples(Tracker(lambda name, args: sent.append((name, args))),
                [data / "rollout_nethack", data / "rollout_text", data / "missing"])
    tables = {args[1]: args[0] for name, args in sent if name == "log_table"}
    assert set(tables) == {"samples/rollout_nethack.json", "samples/rollout_text.json"}
    steps = tables["samples/rollout_nethack.json"]
    assert len(steps["step"]) == 20 and steps["step"][:3] == [0, 2, 4]  # ⌊i·40/20⌋ of one 40-row part
    assert steps["tty_chars"][1].split("\n")[0].startswith("step 000002")  # a frame as 24 lines of text
    text = tables["samples/rollout_text.json"]
    assert text["conversation"][0].startswith("[system] Play.\n\n[user] Guess a word.")
    json.dumps(tables)  # what goes down the pipe to the tracking process


@pytest.mark.slow  # MLflow's store and one NetHack stage: ~20 s idle
def test_a_stage_run_page_shows_its_table_in_mlflow(tmp_path):
    import os
    import sys

    from mlflow import MlflowClient
    from test_nethack_stages import TINY

    project = make_project(tmp_path, [o for o in TINY if o != "tracking.enabled=false"])
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # the checkout's own store
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "stage", "rollout-nethack"], cwd=project,
                         capture_output=True, text=True, env={**env, "TQDM_DISABLE": "1", "PYTHONPATH": str(project)},
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("curio").experiment_id])
    path = client.download_artifacts(run.info.run_id, "samples/rollout_nethack.json", str(tmp_path))
    logged = json.loads(Path(path).read_text())
    columns = logged["columns"]
    assert {"episode", "step", "message", "tty_chars"} <= set(columns) and len(logged["data"]) == 20
    frame = logged["data"][0][columns.index("tty_chars")]
    assert frame.count("\n") == 23 and "Dlvl:1" in frame


def test_a_large_dataset_is_sampled_and_the_page_says_so(tmp_path):
    from pipeline.reporting.viewer import PAGES, ROW_CAP, page_data

    rows = [episode(i % 24) | {"seed": i} for i in range(ROW_CAP["episodes"] + 100)]
    write(tmp_path / "rollout_text", rows, EPISODE_SCHEMA)
    data = page_data(PAGES[0], tmp_path / "rollout_text", tmp_path)
    n, cap = len(rows), ROW_CAP["episodes"]
    assert (data["total"], data["shown"]) == (n, cap)
    assert [r["seed"] for r in data["rows"]] == [i * n // cap for i in range(cap)]
    assert data["notes"][0].startswith(f"Showing {cap} of {n} rows: an evenly spaced sample")
    assert 'datasets.load_dataset("parquet", data_files=' in data["load"]


def test_paprika_pairs_with_reference_log_probs(tmp_path):
    """Default pairs (PAPRIKA: whole trajectories) as reflogprobs stores them: the turns that made the pair and the
    reference log-probs with their margin."""
    from pipeline.reporting.viewer import PAGES, complete_dataset, page_data

    msgs = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Guess."}]
    row = {"group": "wordle", "task_id": "t0", "prompt": msgs,
           "chosen": [{"role": "assistant", "content": "<Answer>crane</Answer>"}],
           "rejected": [{"role": "assistant", "content": "<Answer>zzzzz</Answer>"}], "chosen_turns": 3,
           "rejected_turns": 6, "rejected_success": False, "prompt_ids": [1, 2], "ref_chosen_logps": -4.5,
           "ref_rejected_logps": -7.25}
    write(tmp_path / "pairs_text" / "preferences", [{k: v for k, v in row.items()
                                                     if "ids" not in k and "logps" not in k}])
    write(tmp_path / "reflogprobs", [row])
    spec = next(p for p in PAGES if p.stage == "pairs-text")
    assert complete_dataset(tmp_path, spec) == tmp_path / "reflogprobs"  # the pairs with their log-probs
    data = page_data(spec, tmp_path / "reflogprobs", tmp_path)
    [shown] = data["rows"]
    assert (shown["chosen_turns"], shown["rejected_turns"], shown["rejected_success"]) == (3, 6, False)
    assert shown["ref_margin"] == 2.75 and "prompt_ids" not in shown  # -4.5 - (-7.25)
    assert data["columns"] == ["group", "task_id", "chosen_turns", "rejected_turns", "rejected_success", "ref_margin"]
    assert "PAPRIKA" in data["notes"][1] and "appears once train-dpo has run" in data["notes"][1]
    # train-dpo's margins join only when they score these very pairs (their upstream hash)
    margin = {"pair": 0, "group": "wordle", "task_id": "t0", "policy_chosen_logps": -4.0, "policy_rejected_logps": -8.0,
              "implicit_margin": 0.1 * ((-4.0 + 4.5) - (-8.0 + 7.25)), "prefers_chosen": True}
    for pairs_hash, joined in (("other pairs", False), (dataset_hash(tmp_path / "reflogprobs"), True)):
        run_chunked(tmp_path / "train_policy" / "dpo_margins", num_chunks=1, make_chunk=lambda _: [margin],
                    params_hash="h", upstream={"pairs": pairs_hash})
        [shown] = page_data(spec, tmp_path / "reflogprobs", tmp_path)["rows"]
        assert ("implicit_margin" in shown) == joined
        assert ("implicit_margin" in page_data(spec, tmp_path / "reflogprobs", tmp_path)["columns"]) == joined
    assert shown["implicit_margin"] == pytest.approx(0.125) and shown["prefers_chosen"]  # 0.1 · (0.5 + 0.75)


def test_pages_of_datasets_without_the_new_columns_say_so(tmp_path):
    """An annotation dataset written before the stages kept per-row cost, and an evaluation whose replays dataset is
    empty (replay_episodes = 0): the pages show what there is and say why the rest is missing."""
    from pipeline.reporting.viewer import PAGES, page_data

    spec = {p.stage: p for p in PAGES}
    write(tmp_path / "annotate_nethack", [{"pair": 0, "episode_first": 0, "step_first": 1, "caption_first": "a",
                                           "episode_second": 0, "step_second": 2, "caption_second": "b",
                                           "label": "FIRST", "raw": "similarity 1=0.3 2=0.1"}])
    data = page_data(spec["annotate-nethack"], tmp_path / "annotate_nethack", tmp_path)
    assert "attempts" not in data["columns"] and "cached" not in data["filters"]
    assert any("no per-row cost columns" in n for n in data["notes"])
    write(tmp_path / "evaluate_nethack", [{"policy": "random", "episode": 0, "seed": 0, "return": 0.0, "score": 0,
                                           "depth": 1, "length": 10, "success": False, "end_status": 1}],
          NETHACK_EPISODE_SCHEMA)
    write(tmp_path / "evaluate_nethack_replays", pa.table({f.name: pa.array([], f.type) for f in REPLAY_STEP_SCHEMA}),
          REPLAY_STEP_SCHEMA)
    data = page_data(spec["evaluate-nethack"], tmp_path / "evaluate_nethack", tmp_path)
    assert [r["replayed"] for r in data["rows"]] == ["no"] and any(n.startswith("No replays") for n in data["notes"])
