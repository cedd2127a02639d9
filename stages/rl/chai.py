"""rl-text, ``rl_text.algorithm: chai``: Online CHAI (Verma et al., 2022), ArCHer's value-based baseline.

The policy is never updated: at every turn it samples ``chai.num_samples`` utterances and the one with the
largest min(Q1, Q2)(s, a) is played (among those with a parseable ``<Answer>``, when any has one; the critic
never sees unparseable turns in its buffer, so it cannot know they are bad). The critic is ArCHer's, trained
the same way (stages/rl/archer.py, ``train_loop(..., actor=False)``) on the re-ranked policy's transitions,
with a_π drawn from the re-ranked policy too. The output model directory holds the policy and, in
``critic/``, the critic: ``load_policy_backend`` then serves the re-ranked policy for evaluation.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from pipeline.core.config import Params
from pipeline.core.stage import StageContext, StageResult
from pipeline.envs.base import extract_answer
from pipeline.llm.base import ChatBackend, Conversation, Generation, Sampling
from stages.rl.archer import DoubleCritic, train_loop

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


def run(params: Params, ctx: StageContext) -> StageResult:
    k = params.rl_text.chai.num_samples

    def acting(policy: ChatBackend, critic: DoubleCritic) -> ChatBackend:
        return CriticRerank(policy, critic, k, batch_size=params.rollout_text.batch_size)

    def save_critic(model_dir: Path, critic: DoubleCritic) -> None:
        critic.save(model_dir / CRITIC_DIR)
        (model_dir / CRITIC_DIR / "chai.json").write_text(json.dumps({"num_samples": k}))

    return train_loop(params, ctx, actor=False, acting=acting, extra_outputs=save_critic)


def load_reranked(policy: ChatBackend, model_dir: str | Path, device: str = "cpu") -> ChatBackend:
    """The CHAI policy saved in ``model_dir``: ``policy`` re-ranked by the critic beside it."""
    critic_dir = Path(model_dir) / CRITIC_DIR
    k = json.loads((critic_dir / "chai.json").read_text())["num_samples"]
    return CriticRerank(policy, DoubleCritic.load(critic_dir, device).eval(), k)


def is_chai_model(model_dir: str | Path) -> bool:
    return (Path(model_dir) / CRITIC_DIR / "chai.json").exists()
