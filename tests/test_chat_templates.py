"""Assistant-only masks, end-of-turn and context fitting for any chat template, on the real SmolLM2-135M-Instruct
weights with five template families (tests/data/chat_templates.yaml) and the model's own template."""

import logging
import math
from pathlib import Path

import pytest
import yaml

from pipeline.llm.base import Sampling
from pipeline.llm.hf import HFBackend, load_policy
from pipeline.models.chat import assistant_token_mask, end_of_turn_id, fit_context, stop_token_ids
from pipeline.models.training import dpo_train, sequence_logps, sft_train, tokenize_pair

FAMILIES = yaml.safe_load((Path(__file__).parent / "data" / "chat_templates.yaml").read_text())
EOT = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", "mistral": "</s>", "gemma": "<end_of_turn>",
       "phi3": "<|end|>", "own": "<|im_end|>"}

PROMPT = [{"role": "system", "content": "You play twenty questions."},
          {"role": "user", "content": "Guess the secret: it is a fruit."}]
CHOSEN = [{"role": "assistant", "content": "<Answer>Is it red?</Answer>"}, {"role": "user", "content": "Yes."},
          {"role": "assistant", "content": "<Answer>Is it an apple?</Answer>"},
          {"role": "user", "content": "Goal reached."}]
REJECTED = [{"role": "assistant", "content": "<Answer>Is it blue?</Answer>"}, {"role": "user", "content": "No."}]


@pytest.fixture(scope="module")
def real(smollm2_dir):
    model, tok = load_policy(smollm2_dir)
    tok.add_special_tokens({"additional_special_tokens": sorted({t for f in FAMILIES.values() for t in f["tokens"]})})
    model.resize_token_embeddings(len(tok))
    return model, tok, tok.chat_template


def use(real, family: str):
    model, tok, own = real
    tok.chat_template = own if family == "own" else FAMILIES[family]["template"]
    return model, tok


def masked_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    runs, cur = [], []
    for t, m in zip(ids, mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    return runs + ([cur] if cur else [])


@pytest.mark.parametrize("family", [*FAMILIES, "own"])
def test_masked_tokens_are_assistant_contents_and_end_of_turn(real, family):
    _, tok = use(real, family)
    eot = tok.convert_tokens_to_ids(EOT[family])
    assert end_of_turn_id(tok) == eot and eot in stop_token_ids(tok)
    ids, mask, _ = assistant_token_mask(tok, PROMPT + CHOSEN)
    runs = masked_runs(ids, mask)
    assert [tok.decode(r[:-1]) for r in runs] == [m["content"] for m in CHOSEN if m["role"] == "assistant"]
    assert [r[-1] for r in runs] == [eot, eot]  # each turn's own end-of-turn token counts, nothing after it
    pair = tokenize_pair(tok, PROMPT, CHOSEN, REJECTED)
    assert pair["prompt_ids"] == ids[: len(pair["prompt_ids"])]
    for side, completion in (("chosen", CHOSEN), ("rejected", REJECTED)):
        runs = masked_runs(pair[f"{side}_ids"], pair[f"{side}_mask"])
        assert [tok.decode(r[:-1]) for r in runs] == [m["content"] for m in completion if m["role"] == "assistant"]


@pytest.mark.parametrize("family", [*FAMILIES, "own"])
def test_multiturn_prompt_counts_only_the_completions_turn(real, family):
    """A multi-turn pair (pairs_text.strategy=multiturn): the prompt holds an earlier assistant turn, which is
    context; the completion's turn alone is masked, and prompt + completion ids are the conversation's."""
    _, tok = use(real, family)
    eot = tok.convert_tokens_to_ids(EOT[family])
    prompt = PROMPT + CHOSEN[:2]
    pair = tokenize_pair(tok, prompt, CHOSEN[2:3], REJECTED[:1])
    for side, completion in (("chosen", CHOSEN[2:3]), ("rejected", REJECTED[:1])):
        ids, _, _ = assistant_token_mask(tok, prompt + completion)
        assert pair["prompt_ids"] + pair[f"{side}_ids"] == ids
        runs = masked_runs(pair[f"{side}_ids"], pair[f"{side}_mask"])
        assert [tok.decode(r[:-1]) for r in runs] == [completion[0]["content"]] and runs[0][-1] == eot


@pytest.mark.parametrize("family", ["chatml", "llama3"])
def test_grpo_trains_on_the_sampled_reply_ids_only(real, family):
    """GRPO's sequences (pipeline.text.grpo): each reply's prompt is the conversation before it rendered with the
    generation prompt (what the policy was fed when it played), its loss tokens the ids it sampled (the turn's
    contents and end of turn here); no template, system or user token carries loss."""
    from pipeline.text.grpo import reply_logps, reply_sequences

    model, tok = use(real, family)
    eot = tok.convert_tokens_to_ids(EOT[family])
    conversation = PROMPT + CHOSEN
    sampled = [tok(m["content"], add_special_tokens=False)["input_ids"] + [eot]
               for m in conversation if m["role"] == "assistant"]
    sequences = reply_sequences(tok, conversation, sampled, max_positions=0, max_new_tokens=16)
    replies = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
    for k, (prompt, reply) in enumerate(sequences):
        assert prompt == tok.apply_chat_template(conversation[:replies[k]], add_generation_prompt=True,
                                                 return_dict=False)
        assert reply == sampled[k] and tok.decode(reply[:-1]) == conversation[replies[k]]["content"]
    logp, loss_mask = reply_logps(model, sequences, pad_id=tok.pad_token_id)
    assert loss_mask.sum(dim=1).tolist() == [len(r) for _, r in sequences]  # loss on the sampled ids, nothing else
    assert (logp[loss_mask == 1] < 0).all() and (logp[loss_mask == 0] == 0).all()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sft_and_dpo_train_on_real_weights(real, family, tmp_path):
    """Two LoRA steps each (adapters removed afterwards, so every family starts from the same weights): SFT
    raises the log-prob of the assistant tokens, DPO the chosen-rejected margin; losses finite."""
    from pipeline.models.config import LoraConfigSection

    base, tok = use(real, family)
    prompt, chosen, rejected = PROMPT[1:], CHOSEN[:1], REJECTED[:1]  # short: one assistant turn each
    pair = tokenize_pair(tok, prompt, chosen, rejected)
    seqs = [(pair["prompt_ids"], pair["chosen_ids"], pair["chosen_mask"]),
            (pair["prompt_ids"], pair["rejected_ids"], pair["rejected_mask"])]
    c0, r0 = sequence_logps(base, seqs)
    lora = LoraConfigSection(enabled=True, r=8, alpha=16)
    sft, history, _ = sft_train(base, tok, [prompt + chosen], tmp_path / "sft", lr=1e-2, epochs=2, batch_size=1,
                                warmup_ratio=0.0, lora=lora, merge=False)
    c1, _ = sequence_logps(sft, seqs)
    sft.unload()
    row = {**pair, "ref_chosen_logps": c0, "ref_rejected_logps": r0}
    dpo, _, _ = dpo_train(base, tok, [row], tmp_path / "dpo", lr=1e-2, epochs=2, batch_size=1, beta=0.1,
                          rpo_alpha=0.0, warmup_ratio=0.0, lora=lora, merge=False)
    c2, r2 = sequence_logps(dpo, seqs)
    dpo.unload()
    assert math.isfinite(c1) and c1 > c0 + 0.5
    assert math.isfinite(c2) and math.isfinite(r2) and (c2 - r2) > (c0 - r0) + 0.5
    assert sequence_logps(base, seqs[:1]) == pytest.approx([c0], rel=1e-5)  # the shared weights are untouched


def test_generation_stops_at_the_templates_end_of_turn(real):
    model, tok = use(real, "own")
    backend = HFBackend("smollm2", model_obj=model, tokenizer=tok)
    [gen] = backend.generate([[{"role": "user", "content": "Say hello."}]], Sampling(max_tokens=48))
    assert gen.tokens_out < 48 and gen.text and "<|im_end|>" not in gen.text


def test_long_conversation_drops_oldest_turns_not_the_task(real, caplog):
    model, tok = use(real, "own")
    turns = [m for i in range(30) for m in ({"role": "assistant", "content": f"<Answer>Question {i}?</Answer>"},
                                            {"role": "user", "content": f"No, not {i}."})]
    conversation = PROMPT + turns
    full = len(tok.apply_chat_template(conversation, add_generation_prompt=True, return_dict=False))
    fitted, dropped = fit_context(tok, conversation, full // 2)
    assert fitted[:2] == PROMPT and fitted[-1] == conversation[-1] and dropped % 2 == 0 and dropped > 0
    assert [m["role"] for m in fitted[2:4]] == ["assistant", "user"]
    assert len(tok.apply_chat_template(fitted, add_generation_prompt=True, return_dict=False)) <= full // 2
    backend = HFBackend("smollm2", model_obj=model, tokenizer=tok)
    backend.max_positions = full // 2 + 4
    with caplog.at_level(logging.WARNING, logger="pipeline.models.chat"):
        [gen] = backend.generate([conversation], Sampling(max_tokens=4))
    assert gen.tokens_in <= full // 2 and f"dropped its {dropped} oldest turns" in caplog.text
