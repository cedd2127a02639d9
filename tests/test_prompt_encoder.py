"""The built-in template's prompt ids without Jinja equal apply_chat_template's, for any content."""

import random

import pytest

from pipeline.envs.base import make_game
from pipeline.models import tiny
from pipeline.models.chat import encode_prompt
from stages.bootstrap import scripted_episode


@pytest.fixture(scope="module")
def played():
    game = make_game("twenty_questions")
    rng = random.Random(0)
    tasks = game.tasks("train")
    conversations = [scripted_episode(game, tasks[rng.randrange(len(tasks))], rng, 0.5) for _ in range(24)]
    tok = tiny.train_tokenizer([m["content"] for c in conversations[:20] for m in c], 600)
    return tok, conversations


def odd_contents(rng: random.Random) -> list[str]:
    """Text a sampled policy may produce: spaces at the edges, newlines, special-token text, nothing at all."""
    pieces = ["<Answer>", "</Answer>", " ", "\n", "\n\n", "<|end|>", "<|user|>", "é", "Is it", "?", "dog", "  x "]
    return ["", " ", "\n"] + ["".join(rng.choice(pieces) for _ in range(rng.randrange(1, 8))) for _ in range(60)]


def test_prompt_ids_equal_the_rendered_template(played):
    tok, conversations = played
    rng = random.Random(1)
    odd = odd_contents(rng)
    checked = 0
    for c in conversations:
        for k in range(2, len(c) + 1):  # every turn's prompt, as play encodes it
            prefix = [dict(m) for m in c[:k]]
            if rng.random() < 0.3:
                prefix[-1]["content"] = rng.choice(odd)
            want = tok.apply_chat_template(prefix, add_generation_prompt=True, return_dict=False)
            assert tiny.PromptEncoder.of(tok)(prefix) == want
            assert encode_prompt(tok, prefix, 0, 32) == want
            checked += 1
    assert checked > 150


def test_other_templates_and_roles_are_rendered(played):
    tok, conversations = played
    assert tiny.PromptEncoder.of(tok)([{"role": "tool", "content": "x"}]) is None  # no special token for it
    other = tiny.train_tokenizer(["a b c"], 300)
    other.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert tiny.PromptEncoder.of(other) is None
