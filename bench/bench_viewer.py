"""The report's dataset pages at scale: page size, generation time and time for Chromium to open a page, for a
synthetic text-episode dataset of 1k rows beside one of 100k (and NetHack steps of 10 vs 100 episodes).

    python bench/bench_viewer.py [--rows 100000] [--no-browser]

A page holds a deterministic sample (pipeline/viewer.ROW_CAP rows), so its size stays flat while the dataset grows:
what grows is reading the dataset. Goal: every page under 5 MB, opened by headless Chromium in under ~3 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.core.runners import run_chunked
from pipeline.nethack.play import FRAME_STEP_SCHEMA, TTY_SIZE
from pipeline.reporting.viewer import PAGES, page_data, render_page
from pipeline.text.play import EPISODE_SCHEMA

GROUPS = ["twenty_questions", "wordle", "guess_my_city", "mastermind", "battleship"]


def episodes(n: int, start: int = 0) -> list[dict]:
    """Episodes of 8 turns (~2 KB of text each), varied enough that compression cannot cheat."""
    rng = np.random.default_rng(start)
    words = ["apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "crane", "house", "green"]
    rows = []
    for i in range(start, start + n):
        conv = [{"role": "system", "content": "You are playing a game. Answer inside <Answer></Answer>."},
                {"role": "user", "content": f"Task {i}: find the hidden word."}]
        for t in range(8):
            w = words[rng.integers(len(words))]
            conv.append({"role": "assistant", "content": f"Turn {t}, I think of {w} ({rng.random():.6f}). "
                                                         f"<Answer>{w}</Answer>"})
            conv.append({"role": "user", "content": f"Feedback for {w}: {''.join(rng.choice(list('GYX'), 5))}"})
        rows.append({"group": GROUPS[i % 5], "task_id": f"t{i // 4}", "secret": json.dumps({"word": "crane"}),
                     "category": "c", "difficulty": ["easy", "medium", "hard"][i % 3], "split": "train",
                     "sample": i % 4, "conversation": conv, "final_action": "crane", "success": bool(i % 3),
                     "invalid": False, "turns": 8, "score": 8.0, "reward": 0.0, "format_retries": 0, "seed": i,
                     "policy": "base"})
    return rows


def nethack_steps(episodes_n: int, steps: int) -> pa.Table:
    rng = np.random.default_rng(0)
    n = episodes_n * steps
    frames = np.full((n, TTY_SIZE), ord(" "), dtype=np.uint8)
    pos = rng.integers(0, 80, size=n)
    frames[np.arange(n), 5 * 80 + pos] = ord("@")
    return pa.table({"episode": pa.array(np.repeat(np.arange(episodes_n), steps), pa.int32()),
                     "step": pa.array(np.tile(np.arange(steps), episodes_n), pa.int32()),
                     "action": pa.array(rng.integers(0, 20, n), pa.int16()),
                     "reward": pa.array(np.zeros(n), pa.float32()),
                     "message": [["", "You see a newt.", "It's a wall."][k] for k in rng.integers(0, 3, n)],
                     "blstats": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(n * 27), pa.int32()), 27),
                     "done": pa.array(np.arange(n) % steps == steps - 1),
                     "tty_chars": pa.FixedSizeBinaryArray.from_buffers(pa.binary(TTY_SIZE), n,
                                                                        [None, pa.py_buffer(frames.tobytes())])},
                    schema=FRAME_STEP_SCHEMA)


def write_text(path: Path, rows: int) -> None:
    per = 10_000
    run_chunked(path, num_chunks=-(-rows // per), params_hash="bench", schema=EPISODE_SCHEMA,
                make_chunk=lambda i: episodes(min(per, rows - i * per), i * per), desc="writing")


def open_seconds(page: Path) -> float:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        return float("nan")
    start = time.perf_counter()
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri() + "#row=1"],
                   capture_output=True, timeout=120, check=True)
    return time.perf_counter() - start


def measure(stage: str, data: Path, out: Path, browser: bool) -> tuple[float, float, float]:
    spec = next(p for p in PAGES if p.stage == stage)
    start = time.perf_counter()
    page_html = render_page(page_data(spec, data / spec.datasets[0], data))
    seconds = time.perf_counter() - start
    out.write_text(page_html)
    return seconds, out.stat().st_size / 1e6, open_seconds(out) if browser else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()
    browser = not args.no_browser
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for label, rows in (("small", 1000), ("large", args.rows)):
            data = Path(tmp) / label
            write_text(data / "rollout_text", rows)
            results[("text", label)] = (rows, *measure("rollout-text", data, Path(tmp) / f"{label}.html", browser))
        for label, eps in (("small", 10), ("large", 100)):
            data = Path(tmp) / f"nh-{label}"
            table = nethack_steps(eps, 1000)
            run_chunked(data / "rollout_nethack", num_chunks=1, make_chunk=lambda _, t=table: t, params_hash="b",
                        schema=FRAME_STEP_SCHEMA, desc="writing")
            results[("nethack", label)] = (table.num_rows,
                                           *measure("rollout-nethack", data, Path(tmp) / f"nh-{label}.html", browser))
    print(f"{'page':>8} {'rows':>9} {'generate s':>11} {'page MB':>8} {'open s':>7}")
    for (kind, _label), (rows, gen, size, opened) in results.items():
        print(f"{kind:>8} {rows:>9} {gen:>11.2f} {size:>8.2f} {opened:>7.2f}")
    for kind in ("text", "nethack"):
        s, large = results[(kind, "small")], results[(kind, "large")]
        print(f"{kind}: rows x{large[0] / s[0]:.0f} -> generation x{large[1] / s[1]:.2f}, page size "
              f"x{large[2] / s[2]:.2f}, open time x{large[3] / s[3]:.2f}")


if __name__ == "__main__":
    main()
