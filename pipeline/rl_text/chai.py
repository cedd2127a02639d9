"""rl-text, ``rl_text.algorithm: chai``: Online CHAI (Verma et al., 2022), ArCHer's value-based baseline.

The policy is never updated: at every turn it samples ``chai.num_samples`` utterances and the one with the
largest min(Q1, Q2)(s, a) is played (among those with a parseable ``<Answer>``, when any has one; the critic
never sees unparseable turns in its buffer, so it cannot know they are bad). The critic is ArCHer's, trained
the same way (pipeline/rl_text/archer.py, ``train_loop(..., actor=False)``) on the re-ranked policy's transitions,
with a_π drawn from the re-ranked policy too. The output model directory holds the policy and, in
``critic/``, the critic: ``load_policy_backend`` then serves the re-ranked policy for evaluation.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.stage import StageContext, StageResult
from pipeline.llm.base import ChatBackend
from pipeline.params import Params
from pipeline.rl_text import archer
from pipeline.text.critic import CRITIC_DIR, CriticRerank, DoubleCritic

#: What it writes under data/rl_text besides model/: ArCHer's, the same loop writes them.
OUTPUTS = archer.OUTPUTS


def run(params: Params, ctx: StageContext) -> StageResult:
    k = params.rl_text.chai.num_samples

    def acting(policy: ChatBackend, critic: DoubleCritic) -> ChatBackend:
        return CriticRerank(policy, critic, k, batch_size=params.rollout_text.batch_size)

    def save_critic(model_dir: Path, critic: DoubleCritic) -> None:
        critic.save(model_dir / CRITIC_DIR)
        (model_dir / CRITIC_DIR / "chai.json").write_text(json.dumps({"num_samples": k}))

    return archer.train_loop(params, ctx, actor=False, acting=acting, extra_outputs=save_critic)
