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


def respelled(tok, text: str, word: str) -> list[int]:
    """Token ids that decode to ``text`` but spell ``word`` one character a token: ids a sampler can draw that the
    text's own tokenization never gives."""
    head, tail = text.split(word, 1)
    chars = [tok.convert_tokens_to_ids(c) for c in word]
    assert tok.unk_token_id not in chars
    ids = tok(head, add_special_tokens=False)["input_ids"] + chars + tok(tail, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text and ids != tok(text, add_special_tokens=False)["input_ids"]
    return ids


@pytest.mark.parametrize("family", ["chatml", "llama3"])
def test_grpo_trains_on_the_ids_played_not_the_text_tokenized_again(real, family):
    """Token in, token out (pipeline.models.chat.continue_prompt, pipeline.text.grpo): the second turn's prompt is
    the first prompt, the ids sampled (here a spelling of "red" the text's tokenization never gives) and what the
    template adds; the packed episode scores exactly those ids, each reply with the context it was played with:
    the same log-probs as each reply scored alone and as the full-vocabulary softmax of the whole sequence. A
    prompt that re-tokenizes the reply's text does not extend the first one, and the episode falls back to one
    sequence per reply."""
    import torch

    from pipeline.models.chat import continue_prompt
    from pipeline.text.grpo import Packed, pack_episode, reply_logps

    model, tok = use(real, family)
    eot = tok.convert_tokens_to_ids(EOT[family])
    conversation = PROMPT + CHOSEN
    first = tok.apply_chat_template(PROMPT, add_generation_prompt=True, return_dict=False)
    sampled = respelled(tok, CHOSEN[0]["content"], "red") + [eot]
    second = continue_prompt(tok, conversation[:4], 2, first, sampled)
    text_render = tok.apply_chat_template(conversation[:4], add_generation_prompt=True, return_dict=False)
    assert second[: len(first) + len(sampled)] == first + sampled and second != text_render
    assert tok.decode(second) == tok.decode(text_render)  # the same conversation, as it was played
    canonical = tok(CHOSEN[0]["content"], add_special_tokens=False)["input_ids"] + [eot]
    again = continue_prompt(tok, conversation[:4], 2, first, canonical)
    assert again[: len(first) + len(canonical)] == first + canonical and tok.decode(again) == tok.decode(text_render)
    reply = tok(CHOSEN[2]["content"], add_special_tokens=False)["input_ids"] + [eot]

    [packed] = pack_episode([(first, sampled), (second, reply)])
    assert packed.ids == second + reply and packed.replies == [(len(first), len(sampled)), (len(second), len(reply))]
    together = reply_logps(model, [packed])
    alone = reply_logps(model, [Packed(first + sampled, [(len(first), len(sampled))]),
                                Packed(second + reply, [(len(second), len(reply))])])
    full = torch.log_softmax(model(input_ids=torch.tensor([second + reply])).logits[0].float(), dim=-1)
    targets = [(len(first) + i, t) for i, t in enumerate(sampled)] + [(len(second) + i, t) for i, t in
                                                                         enumerate(reply)]
    by_softmax = torch.tensor([float(full[at - 1, t].detach()) for at, t in targets])
    for got in (together, alone):
        assert torch.cat([x.detach() for x in got]).tolist() == pytest.approx(by_softmax.tolist(), abs=2e-4)
    assert len(pack_episode([(first, sampled), (text_render, reply)])) == 2  # no prefix: a sequence each


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
