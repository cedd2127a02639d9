"""DPO/RPO on stored reference log-probs, checked against the formulas on numbers computed here."""

import copy
import math

import pytest
import torch

from pipeline.models import tiny
from pipeline.models.training import dpo_train, padding_free_supported, sequence_logps, sft_train, tokenize_pair

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


def test_mask_covers_assistant_content_and_its_end_of_turn_only(tiny_lm):
    _, tok = tiny_lm
    pair = tokenize_pair(tok, PROMPT, CHOSEN, REJECTED)
    kept = tok.decode([t for t, m in zip(pair["chosen_ids"], pair["chosen_mask"], strict=False) if m])
    # the end-of-turn token the model emits to stop counts; environment turns' template tokens never do
    # (PAPRIKA known bug: its log-probs summed over every template token)
    assert kept == "<Answer>Is it red?</Answer><|end|><Answer>Is it an apple?</Answer><|end|>"
    end = tok.convert_tokens_to_ids("<|end|>")
    assert sum(t == end for t in pair["chosen_ids"]) == 4 and sum(
        m for t, m in zip(pair["chosen_ids"], pair["chosen_mask"], strict=False) if t == end) == 2
    assert "Yes." not in kept and "Goal reached" not in kept


@pytest.mark.parametrize("markers", [True, False], ids=["generation-markers", "offsets"])
def test_multiturn_prompt_keeps_its_own_assistant_turns_out_of_the_completion_mask(tiny_lm, markers):
    """A multi-turn pair's prompt holds the agent's earlier moves (pairs_text.strategy=multiturn, state_turn > 0):
    they are context, not a counted token inside the prompt; only the completion's turn is masked. Both ways of
    finding assistant tokens: the built-in template's {% generation %} markers, and the same template without
    them (located from the rendered text, as for HF templates without markers)."""
    _, tok = tiny_lm
    if not markers:
        tok = copy.deepcopy(tok)
        tok.chat_template = tiny.CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    prompt = PROMPT + CHOSEN[:2]  # system, user, assistant (an earlier move), user (its reply)
    pair = tokenize_pair(tok, prompt, CHOSEN[2:3], REJECTED[:1])
    assert pair["prompt_ids"] == tok.apply_chat_template(prompt, return_dict=False)
    for side, completion in (("chosen", CHOSEN[2:3]), ("rejected", REJECTED[:1])):
        ids, mask = pair[f"{side}_ids"], pair[f"{side}_mask"]
        assert pair["prompt_ids"] + ids == tok.apply_chat_template(prompt + completion, return_dict=False)
        assert tok.decode([t for t, m in zip(ids, mask, strict=True) if m]) == completion[0]["content"] + "<|end|>"
        assert mask[0] == 0  # the role header before the content


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


# -- DPO loss types on stored reference log-probs ----------------------------------------------------------------
def test_accepted_loss_types_are_the_installed_trl_dpo_losses():
    import re

    from trl import DPOConfig

    from pipeline.models.config import DPO_LOSS_TYPES

    documented = re.findall(r"`'(\w+)'`", DPOConfig.__dataclass_fields__["loss_type"].metadata["help"])
    assert set(DPO_LOSS_TYPES) == set(documented) - {"sft"}  # sft is RPO's term: rpo_alpha


def test_unusable_loss_types_are_one_line_config_errors(tiny_lm, tmp_path):
    from pipeline.core.config import ConfigError
    from pipeline.params import load_params

    with pytest.raises(ConfigError, match=r"train_policy\.dpo\.loss_type: unknown loss_type 'dpo'; valid: sigmoid, "):
        load_params("params.yaml", ["train_policy.dpo.loss_type=dpo"])
    with pytest.raises(ConfigError, match="reference-free.*use sigmoid_norm"):
        load_params("params.yaml", ["train_policy.dpo.loss_type=simpo"])
    with pytest.raises(ConfigError, match="rpo_alpha"):
        load_params("params.yaml", ["train_policy.dpo.loss_type=sft"])
    with pytest.raises(ConfigError, match="label_smoothing > 0"):
        load_params("params.yaml", ["train_policy.dpo.loss_type=exo_pair"])
    model, tok = tiny_lm
    with pytest.raises(ConfigError, match="simpo"):  # the trainer entry point checks too, before any training
        dpo_train(model, tok, [], tmp_path / "ckpt", lr=1e-3, epochs=1, batch_size=1, beta=0.1, rpo_alpha=0.0,
                  loss_type="simpo")
    assert not (tmp_path / "ckpt").exists()


def first_loss(tiny_lm, tmp_path, shift_chosen, shift_rejected, **kw):
    """First logged loss of DPO at a negligible lr, with stored reference log-probs set to the policy's minus a
    shift, so that log π/π_ref is exactly ``shift_chosen`` and ``shift_rejected``."""
    model, tok = tiny_lm
    pair = tokenize_pair(tok, PROMPT, CHOSEN, REJECTED)
    c, r = sequence_logps(model, [(pair["prompt_ids"], pair["chosen_ids"], pair["chosen_mask"]),
                                  (pair["prompt_ids"], pair["rejected_ids"], pair["rejected_mask"])])
    row = {**pair, "ref_chosen_logps": c - shift_chosen, "ref_rejected_logps": r - shift_rejected}
    copy = tiny.build_model(tok, n_layer=1, n_embd=32, n_head=2, n_positions=128, seed=0)
    copy.load_state_dict(model.state_dict())
    _, history, _ = dpo_train(copy, tok, [row] * 5, tmp_path / "ckpt", lr=1e-12, epochs=1, batch_size=1,
                              rpo_alpha=0.0, warmup_ratio=0.0, **kw)
    return history[0]["loss"], sum(pair["chosen_mask"]), sum(pair["rejected_mask"])


@pytest.mark.parametrize("loss_type", ["sigmoid_norm", "ipo"])
def test_length_normalised_losses_divide_stored_log_ratios_by_assistant_tokens(tiny_lm, tmp_path, loss_type):
    # log-ratios +3 (chosen) and -2 (rejected), summed over the assistant tokens only: content + one end-of-turn
    # token per assistant turn, 17 + 2 and 7 + 1 here
    _, tok = tiny_lm
    beta = 1.0 if loss_type == "sigmoid_norm" else 0.1
    loss, n_c, n_r = first_loss(tiny_lm, tmp_path, 3.0, -2.0, beta=beta, loss_type=loss_type)
    assistant_tokens = [len(tok(m["content"])["input_ids"]) for m in CHOSEN + REJECTED if m["role"] == "assistant"]
    assert (n_c, n_r) == (sum(assistant_tokens[:2]) + 2, assistant_tokens[2] + 1) == (19, 8)
    delta = 3.0 / n_c + 2.0 / n_r  # 0.1579 + 0.25 = 0.4079 per token
    expected = {"sigmoid_norm": math.log1p(math.exp(-beta * delta)),  # -log σ(β Δ) = 0.5099
                "ipo": (delta - 1 / (2 * beta)) ** 2}[loss_type]  # (0.4079 - 5)^2 = 21.087
    assert loss == pytest.approx(expected, rel=1e-3)
    unnormalised = math.log1p(math.exp(-beta * 5.0))  # plain DPO on the sums would give 0.0067 at β = 1
    assert abs(loss - unnormalised) > 0.1


def test_label_smoothing_reaches_exo_pair(tiny_lm, tmp_path):
    # at π = π_ref, q = σ(0) = 1/2: EXO = ½(log ½ − log(1 − ε)) + ½(log ½ − log ε) = 2.7613 for ε = 1e-3
    loss, _, _ = first_loss(tiny_lm, tmp_path, 0.0, 0.0, beta=0.1, loss_type="exo_pair", label_smoothing=1e-3)
    eps = 1e-3
    assert loss == pytest.approx(0.5 * (math.log(0.5) - math.log1p(-eps)) + 0.5 * (math.log(0.5) - math.log(eps)),
                                 rel=1e-3)


# -- LoRA ---------------------------------------------------------------------------------------------------------
def fresh_copy(tiny_lm):
    model, tok = tiny_lm
    copy = tiny.build_model(tok, n_layer=1, n_embd=32, n_head=2, n_positions=128, seed=0)
    copy.load_state_dict(model.state_dict())
    return copy, {k: v.detach().clone() for k, v in model.state_dict().items()}


def lora(**kw):
    from pipeline.models.config import LoraConfigSection

    return LoraConfigSection(enabled=True, r=4, alpha=8, **kw)


def test_lora_sft_trains_adapters_only_and_saves_a_merged_plain_model(tiny_lm, tmp_path):
    from pipeline.llm.hf import load_policy

    _, tok = tiny_lm
    model, base = fresh_copy(tiny_lm)
    convs = [PROMPT + CHOSEN] * 16
    peft_model, history, _ = sft_train(model, tok, convs, tmp_path / "ckpt", lr=1e-2, epochs=1, batch_size=4,
                                       warmup_ratio=0.0, lora=lora(), merge=False)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and "c_attn" in n for n in trainable)  # GPT-2 default: c_attn
    for name, value in peft_model.named_parameters():
        if "lora_B" in name:
            assert value.abs().max() > 0  # initialised at 0, so these moved
        elif "lora_" not in name:  # every base weight is exactly as it was
            key = name.removeprefix("base_model.model.").replace("base_layer.", "")
            assert torch.equal(value, base[key]), name
    merged = peft_model.merge_and_unload()
    tiny.save(merged, tok, tmp_path / "model")
    loaded, _ = load_policy(tmp_path / "model")
    state = loaded.state_dict()
    assert set(state) == set(base)  # a plain GPT-2: no adapter weights left
    changed = {k for k in base if not torch.equal(state[k], base[k])}
    assert changed == {"transformer.h.0.attn.c_attn.weight"}
    ids = torch.tensor([tok.apply_chat_template(PROMPT + CHOSEN, return_dict=False)])
    original = tiny.build_model(tok, n_layer=1, n_embd=32, n_head=2, n_positions=128, seed=0)
    original.load_state_dict(base)
    with torch.no_grad():
        assert not torch.allclose(loaded(ids).logits, original.eval()(ids).logits)


def test_lora_dpo_returns_the_merged_model_and_raises_the_margin(tiny_lm, tmp_path):
    from peft import PeftModel

    _, tok = tiny_lm
    model, base = fresh_copy(tiny_lm)
    pair = tokenize_pair(tok, PROMPT, CHOSEN, REJECTED)
    seqs = [(pair["prompt_ids"], pair["chosen_ids"], pair["chosen_mask"]),
            (pair["prompt_ids"], pair["rejected_ids"], pair["rejected_mask"])]
    c0, r0 = sequence_logps(model, seqs)
    row = {**pair, "ref_chosen_logps": c0, "ref_rejected_logps": r0}
    trained, _, _ = dpo_train(model, tok, [row] * 16, tmp_path / "ckpt", lr=3e-2, epochs=2, batch_size=4,
                              beta=0.1, rpo_alpha=0.0, warmup_ratio=0.0,
                              lora=lora(target_modules=["c_attn", "c_fc"]))
    assert not isinstance(trained, PeftModel)
    state = trained.state_dict()
    assert set(state) == set(base)
    assert {k for k in base if not torch.equal(state[k], base[k])} == {
        "transformer.h.0.attn.c_attn.weight", "transformer.h.0.mlp.c_fc.weight"}
    c1, r1 = sequence_logps(trained, seqs)
    assert (c1 - r1) > (c0 - r0)


def test_lora_config_maps_onto_peft():
    from pipeline.models.training import peft_config
    from pipeline.params import load_params

    p = load_params("params.yaml", ["train_policy.lora.enabled=true", "train_policy.lora.r=16",
                                    "train_policy.lora.target_modules=[all-linear]"])
    model = tiny.build_model(tiny.train_tokenizer(["a b"], 70), n_layer=1, n_embd=16, n_head=2, n_positions=64)
    cfg = peft_config(p.train_policy.lora, model)
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout, cfg.target_modules) == (16, 16, 0.0, "all-linear")
    assert peft_config(load_params("params.yaml", ["train_policy.lora.enabled=false"]).train_policy.lora,
                       model) is None


def test_default_lora_adapts_attention_only():
    """On by default, with peft's GPT-2 default: adapters on the attention projection, nothing else trains."""
    from peft import get_peft_model

    from pipeline.models.training import peft_config
    from pipeline.params import load_params

    model = tiny.build_model(tiny.train_tokenizer(["a b"], 70), n_layer=2, n_embd=16, n_head=2, n_positions=64)
    peft_model = get_peft_model(model, peft_config(load_params("params.yaml").train_policy.lora, model))
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert trainable and all(".attn.c_attn.lora_" in n for n in trainable)
    assert len(trainable) == 2 * 2  # lora_A and lora_B in each of the 2 layers


def test_padding_free_sft_trains_as_padded(tiny_lm, tmp_path):
    """Padding-free batches (conversations of different lengths flattened into one) give the padded losses."""
    _, tok = tiny_lm
    convs = [PROMPT + CHOSEN, PROMPT + REJECTED, PROMPT + CHOSEN[:2]] * 4
    histories = []
    for padding_free in (False, True):
        model, _ = fresh_copy(tiny_lm)
        _, history, _ = sft_train(model, tok, convs, tmp_path / f"pf{padding_free}", lr=1e-2, epochs=2,
                                  batch_size=4, warmup_ratio=0.0, padding_free=padding_free)
        histories.append([h["loss"] for h in history])
    assert len(histories[0]) >= 1
    assert histories[1] == pytest.approx(histories[0], rel=1e-4)


def test_padding_free_only_where_it_trained_safely(tiny_lm):
    """On CPU padding-free is always used; on a GPU (bf16) only with flash attention — with sdpa, bf16 and packed
    sequences the built-in model's bootstrap went to NaN on an H100."""
    model, _ = tiny_lm
    assert padding_free_supported(model, on_gpu=False)
    assert not padding_free_supported(model, on_gpu=True)  # the built-in model runs sdpa / eager
    kernel = model.config._attn_implementation
    model.config._attn_implementation = "flash_attention_2"
    try:
        assert padding_free_supported(model, on_gpu=True)
    finally:
        model.config._attn_implementation = kernel
