"""The rl-text stage: online RL of the text policy from the DPO policy, by ``rl_text.algorithm`` (:data:`ALGORITHMS`).

- ``filtered_bc`` (pipeline/rl_text/filtered_bc.py): clone the best trajectories so far (ArCHer's Online Filtered BC);
- ``archer`` (pipeline/rl_text/archer.py): utterance-level double critic + token-level policy gradient;
- ``chai`` (pipeline/rl_text/chai.py): the same critic re-ranks k sampled utterances; the policy is not updated;
- ``grpo`` (pipeline/rl_text/grpo.py): group-relative advantages over a task's episodes, clipped policy gradient.

grpo and filtered_bc share one round driver (pipeline/rl_text/rounds.py): each keeps the val-best round, the DPO
policy counting as round 0, or the last round without val.

All four play ``rounds × tasks_per_round × trajectories_per_task`` train episodes, so their results compare at
equal environment samples. Output: ``data/rl_text/model`` (CHAI adds its critic there) and the
success-vs-episodes history ``metrics/plots/rl_rounds.json``.

Each round's tasks are a uniform sample of the train tasks, or the picks of PAPRIKA's UCB curriculum
(``rl_text.curriculum.enabled``; pipeline/rl_text/rounds.py). ``rl_text.reward`` picks what the algorithms learn
from: ``outcome``, the game's reward, or one of the dense per-utterance rewards of pipeline/text/turn_rewards.py
(``judge``, ``motif``, ``oni``), computed once per round, right after the round is played, and stored with the
round's episodes (``turn_rewards``), so a resumed round learns from the same numbers.
"""

from __future__ import annotations

import shutil
from types import ModuleType

from pipeline.core.config import ConfigError
from pipeline.core.stage import Out, Plot, Stage, StageContext, StageResult
from pipeline.params import Params
from pipeline.rl_text import archer, chai, filtered_bc, grpo
from pipeline.rl_text.rounds import NAME, PARAMS
from pipeline.text.oni_rewards import DIRECTORY as ONI_DIRECTORY
from pipeline.text.play import summary_help
from pipeline.text.policies import policy_deps


def _needs(params: Params) -> list[str]:
    reward_model = ["data/reward_model_text"] if params.rl_text.reward == "motif" else []
    return policy_deps(params.policy, "dpo", served=False) + reward_model  # every algorithm starts from the DPO policy


METRIC_HELP = {
    **summary_help("rollouts/", "every round's train episodes"),
    "rl/chosen_round": "grpo, filtered_bc: the round whose policy is kept (0: the DPO policy it started from)",
    "rl/kept_by_val": "grpo, filtered_bc: 1 when that round was the best on val, 0 when the last round is kept (no "
                      "val split)",
    "rl/val_success_start": "grpo, filtered_bc: val success of the DPO policy rl-text starts from",
    "rl/val_success_chosen": "grpo, filtered_bc: val success of the kept round's policy",
    "rl/mean_turn_reward": "mean per-utterance reward the algorithm learned from (rl_text.reward other than outcome)",
    "grpo/old_pass_total_s": "grpo: seconds scoring each round's replies under the weights that played them "
                             "(pi_old), summed over the rounds this run trained (per round: MLflow's grpo_old_pass_s, "
                             "step = round)",
    "grpo/update_total_s": "grpo: seconds of the policy-gradient updates, summed over the rounds this run trained "
                           "(per round: MLflow's grpo_update_s, step = round)",
    "rl/server_starts": "vLLM servers this run started (policy.backend: vllm)",
    "rl/served_probe_gap": "policy.backend: vllm: the largest log-probability gap per probe token between the vLLM "
                           "server and the trainer on the same weights, over this run's in-place reloads",
    "rl/transitions": "archer, chai: transitions in the replay buffer",
    "rl/critic_loss": "archer, chai: the critic's mean loss, last round",
    "rl/actor_loss": "archer: the policy-gradient loss, last round",
    "rl/advantage": "archer: mean advantage of the actor's steps, last round",
    "curriculum/{arm}/pulls": "rl_text.curriculum: tasks of this difficulty the curriculum picked",
    "curriculum/{arm}/mean_potential": "rl_text.curriculum: mean learning potential of this difficulty's tasks",
    "rl/judge_computed/{counter}": "reward judge: counts over the continuations this run played and judged",
    "rl/motif/mean_normalised": "reward motif: mean normalised reward of the moves scored",
    "rl/motif/above_threshold": "reward motif: share of the moves above the reward threshold",
    "rl/infogain/mean_bits": "reward infogain: mean expected information gain of a question, bits",
    "rl/oni/{counter}": "reward oni: the online annotator's counts (labels, pending, helpful_share, requests, "
                        "given_up, published_round, annotator_restarts, its LLM ledger as llm_...)",
}

STAGE = Stage(
    NAME,
    params=PARAMS,
    code=[
        "pipeline/rl_text/rounds.py", "pipeline/rl_text/filtered_bc.py", "pipeline/rl_text/archer.py",
        "pipeline/rl_text/chai.py",
        "pipeline/rl_text/grpo.py", "pipeline/text/grpo.py",
        "pipeline/text/critic.py", "pipeline/text/play.py", "pipeline/text/policies.py", "pipeline/models/training.py",
        "pipeline/envs", "pipeline/text/curriculum.py", "pipeline/text/multiturn_pairs.py",
        "pipeline/text/multiturn_reward.py", "pipeline/text/prompts/multiturn_judge.yaml",
        "pipeline/models/reward_net.py", "pipeline/text/utterance_prefs.py", "pipeline/text/turn_rewards.py",
        "pipeline/text/oni_rewards.py", "pipeline/text/oni.py", "pipeline/text/prompts/oni_label.yaml",
        "pipeline/llm/online_annotation.py",
        # what shapes the weights trained: where and how the policy plays and is scored
        "pipeline/rl_text/serving.py", "pipeline/llm/sampler.py", "pipeline/llm/hf.py", "pipeline/llm/kv_cache.py",
        "pipeline/llm/vllm.py", "pipeline/llm/openai_backend.py", "pipeline/llm/base.py",
        "pipeline/models/attention.py", "pipeline/models/chat.py", "pipeline/models/linear.py",
    ],
    data=["data/train_policy/sft", "data/train_policy/dpo", "data/reward_model_text"],
    needs=_needs,
    outs=[Out("data/rl_text", persist=True)],
    plots=[
        Plot("metrics/plots/rl_rounds.json",
             "rl-text, success over environment samples (algorithms compare at equal samples)", x="episodes",
             y="success_rate"),
    ],
    models=["rl_text/model"],
    notes={"pipeline/envs": "the games it plays"},
    metric_help=METRIC_HELP,
)

#: ``rl_text.algorithm`` → the module that runs it (``run(params, ctx)``) and names what it writes under
#: data/rl_text besides model/ (``OUTPUTS``: another algorithm's leftovers are removed). A value the params schema
#: allows without an entry here fails the tests.
ALGORITHMS: dict[str, ModuleType] = {"filtered_bc": filtered_bc, "archer": archer, "chai": chai, "grpo": grpo}


def run(params: Params, ctx: StageContext) -> StageResult:
    algorithm = params.rl_text.algorithm
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"rl_text.algorithm: no algorithm named {algorithm!r}; known: {', '.join(ALGORITHMS)}")
    out = params.data_path("rl_text")
    for name in set().union(*(m.OUTPUTS for m in ALGORITHMS.values())) - ALGORITHMS[algorithm].OUTPUTS:
        shutil.rmtree(out / name, ignore_errors=True)
    if params.rl_text.reward != "oni":
        shutil.rmtree(out / ONI_DIRECTORY, ignore_errors=True)  # the ONI annotator's state (turn rewards)
    return ALGORITHMS[algorithm].run(params, ctx)
