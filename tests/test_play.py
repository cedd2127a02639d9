"""The episode loop: answer extraction, format retries, turn limit, success, batching across games."""

from pipeline.envs.base import extract_answer, make_game
from pipeline.llm.base import ChatBackend, Generation, Sampling
from pipeline.text.play import play_episodes, summarize


class Scripted(ChatBackend):
    """Answers from a function of the conversation; counts calls."""

    def __init__(self, fn):
        super().__init__("scripted")
        self.fn, self.calls, self.batch_sizes = fn, 0, []

    def generate(self, conversations, sampling):
        self.calls += 1
        self.batch_sizes.append(len(conversations))
        return [Generation(text=self.fn(c)) for c in conversations]


def test_extract_answer():
    assert extract_answer("think... <Answer> Is it red? </Answer>") == "Is it red?"
    assert extract_answer("<answer>a</answer> then <Answer>b</Answer>") == "b"
    assert extract_answer("no tags") is None and extract_answer("<Answer> </Answer>") is None


def test_success_turns_and_batching():
    game = make_game("twenty_questions")
    task = next(t for t in game.tasks("train") if t.task_id == "dog")
    policy = Scripted(lambda c: "<Answer>Is it alive?</Answer>" if len(c) < 6 else "<Answer>Is it a dog?</Answer>")
    rows = play_episodes(policy, [(game, task, s) for s in range(3)], Sampling(), seed=0)
    assert [r["turns"] for r in rows] == [3, 3, 3] and all(r["success"] for r in rows)
    assert rows[0]["conversation"][-1]["content"] == "Goal reached"
    assert policy.batch_sizes == [3, 3, 3]  # all episodes generated together each turn


def test_format_failures_retry_then_invalid():
    game = make_game("twenty_questions")
    task = game.tasks("train")[0]
    policy = Scripted(lambda c: "I think it is a dog")
    rows = play_episodes(policy, [(game, task, 0)], Sampling(), seed=0, max_format_retries=2)
    assert rows[0]["invalid"] and not rows[0]["success"] and rows[0]["turns"] == 0
    assert policy.calls == 3 and rows[0]["format_retries"] == 3
    assert len(rows[0]["conversation"]) == 2  # unparseable outputs are not appended


def test_turn_limit_ends_episode_as_failure():
    game = make_game("twenty_questions")
    task = game.tasks("train")[0]
    rows = play_episodes(Scripted(lambda c: "<Answer>Is it alive?</Answer>"), [(game, task, 0)], Sampling(), seed=0)
    assert rows[0]["turns"] == game.max_turns and not rows[0]["success"] and rows[0]["score"] == game.max_turns
    stats = summarize(rows)
    assert stats["success_rate"] == 0.0 and stats["episodes"] == 1
