"""Twenty questions / guess my city with an LLM host: wiring, batching, the ledger in stage metrics, over HTTP."""

import json
import random
import shutil
from pathlib import Path

import pytest
from fake_openai_server import FakeServer, host_reply

from pipeline.envs.base import make_game
from pipeline.envs.llm_host import environment_messages
from pipeline.envs.twenty_questions import oracle_reply
from pipeline.llm import CachedBackend, Ledger
from pipeline.llm.base import ChatBackend, Generation, Sampling
from pipeline.llm.environment import environment_accounting, environment_metrics
from pipeline.params import load_params
from pipeline.text.policies import make_games

REPO = Path(__file__).resolve().parents[1]

KEY_ENV = "CURIO_TEST_ENV_KEY"
SENTINEL = "sk-curio-ENVSENTINEL-41b7e2"


class Scripted(ChatBackend):
    """Answers ``script(conversation)``; records each generate call's conversations."""

    name = "scripted"

    def __init__(self, script):
        super().__init__("scripted")
        self.script = script
        self.calls: list[list[list[dict]]] = []

    def generate(self, conversations, sampling: Sampling):
        self.calls.append(conversations)
        return [Generation(self.script(c)) for c in conversations]


def question_of(conversation) -> str:
    return conversation[1]["content"].split("New question: ")[1].splitlines()[0]


# -- the game side, with a scripted host ---------------------------------------------------------------------
def test_twenty_questions_asks_the_llm_host_in_one_batch_per_turn():
    def host(conv):
        q = question_of(conv)
        retried = any(m["role"] == "assistant" for m in conv)
        if "riddle" in q:
            return "Hmm, tricky."
        if "big" in q:
            return "Yes" if retried else "Yes, quite big."  # not allowed: re-asked, then valid
        return "Goal reached" if "dog" in q else "No"

    inner = Scripted(host)
    env = CachedBackend(inner, None, Ledger("environment"))
    game = make_game("twenty_questions", environment=env)
    task = next(t for t in game.tasks("train") if t.env == "dog")
    states = [game.reset(task, random.Random(0)) for _ in range(3)]
    first = game.step_batch(states, ["Is it big?", "Is this a riddle?", "Does it purr?"])
    assert [r.reply for r in first] == ["Yes.", game.prompts("unknown"), "No."]  # the game's own wording
    assert first[1].info["unanswerable"] and first[0].info["host_reply"] == "Yes"
    assert len(inner.calls[0]) == 3  # one batch for the three episodes
    second = game.step_batch(states, ["Is it a dog?", "Is it a cat?", "Is it a dog?"])
    assert [r.success for r in second] == [True, False, True] and states[0].done and states[0].turns == 2
    # The host saw the secret, the category and the history of this episode (its own labels).
    last = inner.calls[-1][0]
    assert '"dog"' in last[0]["content"] and "mammal" in last[0]["content"]
    assert "1. Is it big? -> Yes" in last[1]["content"]
    assert env.ledger.unknowns == 1 and env.ledger.requests > 6
    # Finished episodes are not sent again; the game-over reply comes back.
    before = len(inner.calls)
    third = game.step_batch(states, ["Is it a dog?", "Is it a cow?", "Is it a dog?"])
    assert third[0].done and third[0].reply == game.prompts("over") and len(inner.calls[before]) == 1


def test_without_environment_the_program_answers():
    game = make_game("twenty_questions")
    state = game.reset(game.tasks("train")[0], random.Random(0))
    assert game.step(state, "Is it an animal?").reply in {"Yes.", "No.", game.prompts("unknown")}
    assert environment_metrics([game]) == {}


def test_guess_my_city_goal_reached_uses_its_solved_line():
    env = CachedBackend(Scripted(lambda c: "Goal reached" if "Delhi" in question_of(c) else "No"), None)
    game = make_game("guess_my_city", environment=env)
    task = next(t for t in game.tasks("train") if t.env == "Delhi")
    state = game.reset(task, random.Random(0))
    assert game.step(state, "Is it in Europe?").reply == "No."
    result = game.step(state, "Is it Delhi?")
    assert result.success and result.reply == game.prompts("solved") and state.turns == 2
    sent = env.inner.calls[0][0]
    assert "Never mention the city" in sent[0]["content"] and '"Delhi"' in sent[0]["content"]


def test_make_games_wires_the_environment_from_params_only(tmp_path, monkeypatch):
    monkeypatch.setenv("CURIO_CACHE_DIR", str(tmp_path / "cache"))
    params = load_params(
        REPO / "params.yaml",
        {
            "games.groups": ["twenty_questions", "guess_my_city", "wordle"],
            "rollout_text.environment.backend": "openai",
            "rollout_text.environment.model": "m",
            "rollout_text.environment.base_url": "http://127.0.0.1:9/v1",
        },
    )
    with environment_accounting() as scope:
        games = make_games(params)
        again = make_games(params)
        assert isinstance(games[0].environment, CachedBackend) and games[0].environment.inner.name == "openai"
        assert all(g.environment is games[0].environment for g in games + again)  # one backend in the block
    assert scope.metrics()["environment/requests"] == 0
    assert "environment/requests" in environment_metrics(games)
    rules = load_params(REPO / "params.yaml", {"games.groups": ["twenty_questions"]})
    with environment_accounting() as scope:
        assert make_games(rules)[0].environment is None
    assert scope.metrics() == {}


# -- end to end: a rollout-text stage whose environment is the openai backend on a loopback server -------------
QUESTIONS = {
    "twenty_questions": ["Is it alive?", "Is this a riddle?", "Is it a dog?", "Is it bigger than a car?"],
    "guess_my_city": ["Is it in Europe?", "Is this a riddle?", "Is it New Orleans?", "Is it a capital?"],
}


class ScriptedPolicy(ChatBackend):
    """The agent: a fixed question list per game, cycled by turn (deterministic, so samples of a task agree)."""

    name = "scripted-policy"

    def generate(self, conversations, sampling):
        out = []
        for c in conversations:
            game = "twenty_questions" if "twenty questions" in c[0]["content"] else "guess_my_city"
            turn = sum(m["role"] == "assistant" for m in c)
            out.append(Generation(f"<Answer>{QUESTIONS[game][turn % len(QUESTIONS[game])]}</Answer>"))
        return out


@pytest.fixture(scope="module")
def server():
    srv = FakeServer()
    yield srv
    srv.close()


def _rollout(params, monkeypatch):
    import stages.rollout_text
    from pipeline.core.artifacts import read_rows
    from pipeline.core.stage import execute

    monkeypatch.setattr(stages.rollout_text, "load_policy_backend", lambda *a, **k: ScriptedPolicy())
    monkeypatch.setattr(stages.rollout_text.STAGE, "needs", lambda params: [])  # the policy replaced: no input read
    result = execute("rollout-text", params)
    return result.metrics, read_rows(params.data_path("rollout_text"))


def test_rollout_with_an_openai_environment_end_to_end(server, tmp_path, monkeypatch):
    monkeypatch.setenv(KEY_ENV, SENTINEL)
    monkeypatch.setenv("CURIO_CACHE_DIR", str(tmp_path / "cache"))
    params = load_params(
        REPO / "params.yaml",
        {
            "data_dir": str(tmp_path / "data"),
            "tracking.enabled": False,
            "games.groups": ["twenty_questions", "guess_my_city"],
            "games.max_train_tasks": 2,
            "rollout_text.trajectories_per_task": 2,
            "rollout_text.tasks_per_chunk": 2,
            "rollout_text.environment.backend": "openai",
            "rollout_text.environment.model": "fake-host",
            "rollout_text.environment.base_url": server.base_url,
            "rollout_text.environment.api_key_env": KEY_ENV,
            "rollout_text.environment.backoff_s": 0.01,
        },
    )
    server.configure(host=True, host_invalid_rate=0.3, error_rate=0.05, seed=3)
    metrics, rows = _rollout(params, monkeypatch)
    stats = server.stats()
    env = {k.removeprefix("environment/"): v for k, v in metrics.items() if k.startswith("environment/")}

    # Every reply the agent saw is the server's host answer (not the program oracle's), in the game's words.
    games = {name: make_game(name) for name in QUESTIONS}  # the program games, for their wording and oracle
    differs = 0
    assert len(rows) == 8
    for row in rows:
        game, conv = games[row["group"]], row["conversation"]
        secret, category = json.loads(row["secret"]), row["category"]
        history = []
        for i in range(2, len(conv), 2):
            question = conv[i]["content"].removeprefix("<Answer>").removesuffix("</Answer>")
            text = "\n".join(
                f"{m['role']}: {m['content']}" for m in environment_messages(secret, category, history, question)
            )
            label = host_reply(text)
            label = label if label in game.host_reply_keys else None
            key = game.host_reply_keys[label] if label else game.host_unknown_key
            assert conv[i + 1]["content"] == game.prompts(key), (row["task_id"], question)
            history.append((question, label or "Sorry, I cannot answer that question."))
            if row["group"] == "twenty_questions" and label and oracle_reply(secret, question) != game.prompts(key):
                differs += 1
        named = QUESTIONS[row["group"]][2].split()[-1].rstrip("?")
        assert row["success"] == (named in secret) and row["turns"] == (3 if row["success"] else 20)
    assert differs > 0  # the oracle would have answered otherwise: the answers really came from the server

    # The ledger landed in the stage metrics and matches what the server saw.
    assert env["sent"] == stats["requests"] - stats["by_outcome"].get("error", 0) > 0
    assert env["requests"] > env["unique_requests"] > 0  # the two samples of a task ask the same questions
    assert env["unknowns"] > 0 and env["failures"] == 0 and env["retries"] == stats["by_outcome"].get("error", 0)
    assert env["tokens_in"] > 0 and env["latency_p95_s"] >= env["latency_p50_s"] > 0
    assert metrics["train/episodes"] == 8

    # A rerun from scratch (outputs removed, cache kept) sends nothing and plays the same games.
    shutil.rmtree(params.data_path("rollout_text"))
    server.configure(host=True, host_invalid_rate=0.3, error_rate=0.05, seed=3)
    again, rows_again = _rollout(params, monkeypatch)
    assert server.stats()["requests"] == 0
    assert again["environment/sent"] == 0 and again["environment/cache_hits"] == again["environment/unique_requests"]
    assert [r["conversation"] for r in rows_again] == [r["conversation"] for r in rows]

    # The key is in no artifact, metrics file, cache file or metric.
    assert SENTINEL not in repr(metrics) and SENTINEL not in repr(again)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SENTINEL.encode() not in path.read_bytes(), path


def test_evaluate_text_reports_one_environment_ledger_over_all_policies(server, tmp_path, monkeypatch):
    import stages.evaluate_text
    from pipeline.core.stage import execute

    monkeypatch.setenv("CURIO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(stages.evaluate_text, "load_policy_backend", lambda *a, **k: ScriptedPolicy())
    monkeypatch.setattr(stages.evaluate_text.STAGE, "needs", lambda params: [])  # the policies replaced: no input read
    params = load_params(
        REPO / "params.yaml",
        {
            "data_dir": str(tmp_path / "data"),
            "tracking.enabled": False,
            "games.groups": ["twenty_questions"],
            "games.eval_groups": ["twenty_questions"],
            "games.max_eval_tasks": 2,
            "evaluate_text.policies": ["base", "sft"],
            "evaluate_text.trajectories_per_task": 1,
            "rollout_text.environment.backend": "openai",
            "rollout_text.environment.model": "fake-host",
            "rollout_text.environment.base_url": server.base_url,
        },
    )
    server.configure(host=True)
    metrics = execute("evaluate-text", params).metrics
    sent = server.stats()["requests"]
    # Both policies ask the same questions: the second one's host answers all come from the first's requests.
    assert metrics["environment/sent"] == sent > 0
    assert metrics["environment/cache_hits"] == metrics["environment/unique_requests"] - sent
    assert metrics["environment/requests"] >= 2 * sent and metrics["environment/unknowns"] > 0
    assert metrics["base/episodes"] == metrics["sft/episodes"] == 2
