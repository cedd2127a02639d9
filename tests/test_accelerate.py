"""Multi-process training under `accelerate launch`: 2 CPU processes (gloo, data-parallel) follow the loss curve
of 1 process at the same global batch, for TRL's SFT and DPO trainers as the stages call them."""

import copy

import pytest

from pipeline.models import tiny
from pipeline.models.launch import use_processes
from pipeline.models.training import dpo_train, sft_train, tokenize_pair

ANIMALS = ["cat", "dog", "owl", "fox", "bee", "cow", "eel", "yak", "ant", "bat"]


def conversation(i: int) -> list[dict]:
    a, b = ANIMALS[i % 10], ANIMALS[(3 * i + 1) % 10]
    return [{"role": "system", "content": "Guess the animal."},
            {"role": "user", "content": f"Clue {i}: it is not a {b}."},
            {"role": "assistant", "content": f"<Answer>Is it a {a}?</Answer>"}, {"role": "user", "content": "Yes."}]


@pytest.fixture(scope="module")
def tiny_lm():
    texts = [tiny.conversation_text(conversation(i)) for i in range(40)]
    tok = tiny.train_tokenizer(texts, 300)
    return tiny.build_model(tok, n_layer=1, n_embd=32, n_head=2, n_positions=128, seed=0), tok


def test_sft_on_two_gloo_processes_follows_the_one_process_loss_curve(tiny_lm, tmp_path):
    model, tok = tiny_lm
    convs = [conversation(i) for i in range(40)]
    kw = dict(lr=5e-3, epochs=2, batch_size=4, warmup_ratio=0.0, seed=0, save_steps=1000)
    _, one, _ = sft_train(copy.deepcopy(model), tok, convs, tmp_path / "one", **kw)
    with use_processes(2):
        trained, two, resumed = sft_train(copy.deepcopy(model), tok, convs, tmp_path / "two", **kw)
    assert [h["step"] for h in two] == [h["step"] for h in one] == [5, 10, 15, 20]  # 40 / 4 = 10 steps an epoch
    assert [h["loss"] for h in two] == pytest.approx([h["loss"] for h in one], rel=0.03)
    assert one[-1]["loss"] < 0.75 * one[0]["loss"] and resumed == 0  # it learned; a fresh start
    assert type(trained).__name__ == "GPT2LMHeadModel"  # the trained model comes back to the stage's process


@pytest.mark.slow  # a second launch of 2 processes (~40 CPU-seconds); the SFT test above is the default tier's
def test_dpo_on_two_gloo_processes_follows_the_one_process_loss_curve(tiny_lm, tmp_path):
    model, tok = tiny_lm
    pairs = []
    for i in range(24):
        chosen, rejected = conversation(i), conversation(i + 5)
        p = tokenize_pair(tok, chosen[:2], chosen[2:], rejected[2:])
        pairs.append({**p, "ref_chosen_logps": -20.0, "ref_rejected_logps": -20.0})
    kw = dict(lr=5e-3, epochs=2, batch_size=4, beta=0.1, rpo_alpha=0.0, warmup_ratio=0.0, seed=0, save_steps=1000)
    _, one, _ = dpo_train(copy.deepcopy(model), tok, pairs, tmp_path / "one", **kw)
    with use_processes(2):
        _, two, _ = dpo_train(copy.deepcopy(model), tok, pairs, tmp_path / "two", **kw)
    assert [h["step"] for h in two] == [h["step"] for h in one] == [5, 10]  # 24 / 4 = 6 steps an epoch
    assert [h["loss"] for h in two] == pytest.approx([h["loss"] for h in one], rel=0.03)
