"""The built-in policy: a BPE tokenizer trained on the games' own text and a tiny GPT-2.

The chat template wraps each message in role tags and closes it with ``<|end|>``; assistant content sits
inside ``{% generation %}`` so TRL's assistant-only loss (and our own log-prob masks) find it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pipeline.core.artifacts import save_model_dir

SPECIAL_TOKENS = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|unk|>"]

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>{% generation %}{{ m['content'] }}<|end|>{% endgeneration %}"
    "{% else %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


# Pre-token boundaries: the answer tags and line breaks. Merges may cross spaces, so a phrase the games use
# often ("Is it bigger than a breadbox?", "Sorry, I cannot answer this question.") becomes one token while
# rare text still spells out in bytes.
PRE_TOKEN_SPLIT = r"</?Answer>|\n+"


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """Byte-level BPE over the given texts, wrapped as a PreTrainedTokenizerFast with the chat template.

    Pass one message per text: merges then never span two messages. Unlike a word-level BPE, merges may cross
    spaces (pre-tokens are whole lines between answer tags), so with a few thousand tokens every frequent
    question, guess and reply of the games is a single token and a move is one choice for a tiny model.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|end|>",
        bos_token="<|end|>",
        unk_token="<|unk|>",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 100_000
    return fast


class PromptEncoder:
    """Generation-prompt ids of the built-in chat template, without rendering it: the same ids as
    ``apply_chat_template(messages, add_generation_prompt=True, tokenize=True)``.

    Every message is ``<|role|>content<|end|>`` and special tokens always split the text before BPE, so the ids
    are the role / end tokens around each content's own ids; a content is tokenized once and remembered (a game
    repeats its questions and replies). A conversation re-rendered every turn then costs list concatenation
    instead of a Jinja render and a BPE pass over the whole text. ``None`` for a tokenizer with another template
    or a role without a special token (the caller renders those).
    """

    MAX_CACHED = 200_000

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.roles = {r: tokenizer.convert_tokens_to_ids(f"<|{r}|>") for r in ("system", "user", "assistant")}
        self.end = tokenizer.convert_tokens_to_ids("<|end|>")
        self._ids: dict[str, list[int]] = {}

    @classmethod
    def of(cls, tokenizer) -> PromptEncoder | None:
        """The tokenizer's encoder (made once per tokenizer), or None when its template is not the built-in one."""
        if getattr(tokenizer, "chat_template", None) != CHAT_TEMPLATE or not getattr(tokenizer, "is_fast", False):
            return None
        enc = getattr(tokenizer, "_curio_prompt_encoder", None)
        if enc is None:
            enc = tokenizer._curio_prompt_encoder = cls(tokenizer)
        return enc

    def content_ids(self, text: str) -> list[int]:
        ids = self._ids.get(text)
        if ids is None:
            if len(self._ids) >= self.MAX_CACHED:
                self._ids.clear()
            ids = self._ids[text] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids

    def __call__(self, messages: list[dict]) -> list[int] | None:
        ids: list[int] = []
        for m in messages:
            role = self.roles.get(m["role"])
            if role is None or not isinstance(m["content"], str):
                return None
            ids.append(role)
            ids += self.content_ids(m["content"])
            ids.append(self.end)
        ids.append(self.roles["assistant"])
        return ids


def build_model(tokenizer, n_layer: int, n_embd: int, n_head: int, n_positions: int, seed: int = 0):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = GPT2LMHeadModel(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def conversation_text(conversation: list[dict]) -> str:
    return "\n".join(m["content"] for m in conversation)


def is_builtin(model: str) -> bool:
    return model == "builtin"


def param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def save(model, tokenizer, path: Path) -> None:
    """save_pretrained beside ``path``, with a manifest of file hashes, then swapped in (the old model is
    replaced only once the new one is complete; ``verify_model`` checks it at load)."""
    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    save_model_dir(path, write)
