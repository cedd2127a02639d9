"""The utterance-level double critic of ArCHer and Online CHAI, and the CHAI policy it re-ranks.

The critic (Q1, Q2 on the state and the agent's utterance, V1, V2 on the state) is trained by
pipeline/rl_text/archer.py; Online CHAI (pipeline/rl_text/chai.py) saves it beside the policy, in ``critic/``, and
:func:`load_reranked` serves that policy re-ranked by it: what :func:`pipeline.text.policies.load_policy_backend`
loads for a CHAI model directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from pipeline.core.artifacts import atomic_write_json
from pipeline.envs.base import extract_answer
from pipeline.llm.base import ChatBackend, Conversation, Generation, Sampling

HEAD_HIDDEN = 256


# -- the critic ---------------------------------------------------------------------------------------------
def state_text(conversation: list[dict]) -> str:
    return "\n".join(f"{m['role']}: {m['content']}" for m in conversation)


class DoubleCritic(nn.Module):
    """Q1, Q2 on [h_s; h_a] and V1, V2 on h_s, over one shared text encoder (mean-pooled last hidden state)."""

    def __init__(self, encoder: nn.Module, tokenizer, max_state_tokens: int = 256, max_action_tokens: int = 64):
        super().__init__()
        self.encoder, self.tokenizer = encoder, tokenizer
        self.max_state_tokens, self.max_action_tokens = max_state_tokens, max_action_tokens
        d = encoder.config.hidden_size

        def head(n_in: int) -> nn.Module:
            return nn.Sequential(nn.Linear(n_in, HEAD_HIDDEN), nn.ReLU(), nn.Linear(HEAD_HIDDEN, 1))

        self.q1, self.q2, self.v1, self.v2 = head(2 * d), head(2 * d), head(d), head(d)

    def embed(self, texts: list[str], max_tokens: int, keep_end: bool) -> torch.Tensor:
        """Mean of the last hidden states over real tokens. Right padding: with the mask, no real token sees a
        pad (causal encoders) and positions start at 0 (bidirectional ones). States keep their newest tokens."""
        ids = [self.tokenizer(t, add_special_tokens=True)["input_ids"] or [self.tokenizer.pad_token_id]
               for t in texts]
        ids = [x[-max_tokens:] if keep_end else x[:max_tokens] for x in ids]
        width = max(len(x) for x in ids)
        device = next(self.parameters()).device
        pad = self.tokenizer.pad_token_id
        batch = torch.tensor([x + [pad] * (width - len(x)) for x in ids], device=device)
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids], device=device)
        hidden = self.encoder(input_ids=batch, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1)

    def forward(self, states: list[list[dict]], actions: list[str]) -> tuple[torch.Tensor, ...]:
        """(Q1, Q2, V1, V2), each of shape [batch]."""
        h_s = self.embed([state_text(s) for s in states], self.max_state_tokens, keep_end=True)
        h_a = self.embed(actions, self.max_action_tokens, keep_end=False)
        h_sa = torch.cat([h_s, h_a], dim=-1)
        return tuple(f(x).squeeze(-1) for f, x in ((self.q1, h_sa), (self.q2, h_sa), (self.v1, h_s), (self.v2, h_s)))

    def values(self, states: list[list[dict]]) -> tuple[torch.Tensor, torch.Tensor]:
        h_s = self.embed([state_text(s) for s in states], self.max_state_tokens, keep_end=True)
        return self.v1(h_s).squeeze(-1), self.v2(h_s).squeeze(-1)

    def save(self, path: Path) -> None:
        """The encoder with save_pretrained (safetensors) and the heads as a safetensors file."""
        from safetensors.torch import save_file

        self.encoder.save_pretrained(path / "encoder", safe_serialization=True)
        self.tokenizer.save_pretrained(path / "encoder")
        heads = {f"{n}.{k}": v.contiguous() for n in ("q1", "q2", "v1", "v2")
                 for k, v in getattr(self, n).state_dict().items()}
        save_file(heads, str(path / "heads.safetensors"))
        atomic_write_json(path / "critic.json", {"max_state_tokens": self.max_state_tokens,
                                                 "max_action_tokens": self.max_action_tokens})

    @classmethod
    def load(cls, path: Path, device: str = "cpu") -> DoubleCritic:
        from safetensors.torch import load_file

        meta = json.loads((path / "critic.json").read_text())
        encoder, tokenizer = load_encoder(path / "encoder")
        critic = cls(encoder, tokenizer, **meta)
        heads = load_file(str(path / "heads.safetensors"))
        for n in ("q1", "q2", "v1", "v2"):
            getattr(critic, n).load_state_dict({k.split(".", 1)[1]: v for k, v in heads.items()
                                                if k.startswith(n + ".")})
        return critic.to(device)


def load_encoder(source: str | Path):
    """Any HF model's base transformer (``AutoModel``): a causal LM checkpoint yields its body, no LM head."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return AutoModel.from_pretrained(str(source), dtype=torch.float32), tokenizer


CRITIC_DIR = "critic"


class CriticRerank(ChatBackend):
    """A policy whose every reply is the argmax of min(Q1, Q2) over k of the wrapped policy's samples."""

    name = "chai"

    def __init__(self, policy: ChatBackend, critic: DoubleCritic, num_samples: int, batch_size: int = 64) -> None:
        super().__init__(f"chai({policy.model})")
        self.policy, self.critic, self.k, self.batch_size = policy, critic, num_samples, batch_size

    @torch.no_grad()
    def generate(self, conversations: list[Conversation], sampling: Sampling) -> list[Generation]:
        k = self.k
        cands = self.policy.generate([c for c in conversations for _ in range(k)], sampling)
        states = [c for c in conversations for _ in range(k)]
        scores: list[float] = []
        for i in range(0, len(cands), self.batch_size):
            batch = slice(i, i + self.batch_size)
            q1, q2, _, _ = self.critic(states[batch], [g.text for g in cands[batch]])
            scores.extend(torch.minimum(q1, q2).tolist())
        out = []
        for j in range(len(conversations)):
            group = list(range(j * k, (j + 1) * k))
            valid = [i for i in group if extract_answer(cands[i].text) is not None] or group
            best = max(valid, key=lambda i: scores[i])
            chosen = cands[best]
            out.append(Generation(text=chosen.text, tokens_in=chosen.tokens_in,
                                  tokens_out=sum(cands[i].tokens_out for i in group)))
        return out


def load_reranked(policy: ChatBackend, model_dir: str | Path, device: str = "cpu") -> ChatBackend:
    """The CHAI policy saved in ``model_dir``: ``policy`` re-ranked by the critic beside it."""
    critic_dir = Path(model_dir) / CRITIC_DIR
    k = json.loads((critic_dir / "chai.json").read_text())["num_samples"]
    return CriticRerank(policy, DoubleCritic.load(critic_dir, device).eval(), k)


def is_chai_model(model_dir: str | Path) -> bool:
    return (Path(model_dir) / CRITIC_DIR / "chai.json").exists()
