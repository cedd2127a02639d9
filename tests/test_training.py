"""DPO/RPO on stored reference log-probs, checked against the formulas on numbers computed here."""

import math

import pytest
import torch

from pipeline.models import tiny
from pipeline.models.training import dpo_train, sequence_logps, tokenize_pair

PROMPT = [{"role": "system", "content": "Guess the thing."}, {"role": "user", "content": "It is a fruit."}]
CHOSEN = [{"role": "assistant", "content": "<Answer>Is it red?</Answer>"}, {"role": "user", "content": "Yes."},
          {"role": "assistant", "content": "<Answer>Is it an apple?</Answer>"},
          {"role": "user", "content": "Goal reached"}]
REJECTED = [{"role": "assistant", "content": "<Answer>Is it blue?</Answer>"}, {"role": "user", "content": "No."}]


@pytest.fixture(scope="module")
def tiny_lm():
    texts = [tiny.conversation_text(PROMPT + CHOSEN), tiny.conversation_text(PROMPT + REJECTED)] * 20
    tok = tiny.train_tokenizer(texts, 300)
    model = tiny.build_model(tok, n_layer=1, n_embd=32, n_head=2, n_positions=128, seed=0)
    return model, tok


def test_mask_covers_assistant_content_only(tiny_lm):
    _, tok = tiny_lm
    pair = tokenize_pair(tok, PROMPT, CHOSEN, REJECTED)
    kept = tok.decode([t for t, m in zip(pair["chosen_ids"], pair["chosen_mask"], strict=False) if m])
    assert kept == "<Answer>Is it red?</Answer><Answer>Is it an apple?</Answer>"
    # regression (PAPRIKA known bug): the end-of-turn template token never counts
    end = tok.convert_tokens_to_ids("<|end|>")
    assert all(not m for t, m in zip(pair["chosen_ids"], pair["chosen_mask"], strict=False) if t == end)
    assert "Yes." not in kept and "Goal reached" not in kept


def test_sequence_logps_is_masked_sum(tiny_lm):
    model, tok = tiny_lm
    pair = tokenize_pair(tok, PROMPT, CHOSEN, REJECTED)
    ids = torch.tensor([pair["prompt_ids"] + pair["chosen_ids"]])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    mask = torch.tensor([0] * len(pair["prompt_ids"]) + pair["chosen_mask"], dtype=torch.float)[1:]
    expected = float((logp * mask).sum())
    got = sequence_logps(model, [(pair["prompt_ids"], pair["chosen_ids"], pair["chosen_mask"])])[0]
    assert got == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("rpo_alpha", [0.0, 1.0])
def test_dpo_first_step_loss_matches_formula(tiny_lm, tmp_path, rpo_alpha):
    """With π = π_ref the DPO term is −log σ(0) = log 2; RPO adds α × mean NLL over chosen assistant tokens."""
    model, tok = tiny_lm
    pair = tokenize_pair(tok, PROMPT, CHOSEN, REJECTED)
    c = sequence_logps(model, [(pair["prompt_ids"], pair["chosen_ids"], pair["chosen_mask"])])[0]
    r = sequence_logps(model, [(pair["prompt_ids"], pair["rejected_ids"], pair["rejected_mask"])])[0]
    row = {**pair, "ref_chosen_logps": c, "ref_rejected_logps": r}
    n_tokens = sum(pair["chosen_mask"])
    expected = math.log(2) + rpo_alpha * (-c / n_tokens)
    copy = tiny.build_model(tok, n_layer=1, n_embd=32, n_head=2, n_positions=128, seed=0)
    copy.load_state_dict(model.state_dict())
    # five steps at a negligible lr: the first logged loss (mean of steps 1-5) is the loss at π = π_ref
    _, history, _ = dpo_train(copy, tok, [row] * 5, tmp_path / "ckpt", lr=1e-12, epochs=1, batch_size=1, beta=0.1,
                           rpo_alpha=rpo_alpha, warmup_ratio=0.0)
    assert history[0]["loss"] == pytest.approx(expected, rel=1e-3)


def test_dpo_raises_margin(tiny_lm, tmp_path):
    model, tok = tiny_lm
    pair = tokenize_pair(tok, PROMPT, CHOSEN, REJECTED)
    seqs = [(pair["prompt_ids"], pair["chosen_ids"], pair["chosen_mask"]),
            (pair["prompt_ids"], pair["rejected_ids"], pair["rejected_mask"])]
    c0, r0 = sequence_logps(model, seqs)
    row = {**pair, "ref_chosen_logps": c0, "ref_rejected_logps": r0}
    trained, _, _ = dpo_train(model, tok, [row] * 16, tmp_path / "ckpt", lr=1e-2, epochs=2, batch_size=4, beta=0.1,
                           rpo_alpha=0.0, warmup_ratio=0.0)
    c1, r1 = sequence_logps(trained, seqs)
    assert (c1 - r1) > (c0 - r0) + 1.0
