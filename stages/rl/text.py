"""The rl-text stage: online RL of the text policy from the DPO policy, by ``rl_text.algorithm``.

- ``filtered_bc`` (stages/rl/filtered_bc.py): clone the best trajectories so far (ArCHer's Online Filtered BC);
- ``archer`` (stages/rl/archer.py): utterance-level double critic + token-level policy gradient;
- ``chai`` (stages/rl/chai.py): the same critic re-ranks k sampled utterances; the policy is not updated.

All three play ``rounds × tasks_per_round × trajectories_per_task`` train episodes, so their results compare at
equal environment samples. Output: ``data/rl_text/model`` (CHAI adds its critic there) and the
success-vs-episodes history ``metrics/plots/rl_rounds.json``.
"""

from __future__ import annotations

import importlib
import shutil

from pipeline.core.stage import Out, Plot, Stage, StageContext, StageResult
from pipeline.params import Params
from pipeline.text.policies import policy_deps

NAME = "rl-text"


def _needs(params: Params) -> list[str]:
    return policy_deps(params, "dpo", served=False)  # every algorithm starts from the DPO policy


STAGE = Stage(
    NAME,
    params=[
        "seed", "policy", "games.groups", "games.max_train_tasks", "games.val_fraction", "rollout_text", "rl_text",
        "train_policy.lora",  # filtered_bc's adapters with rl_text.lora
    ],
    code=[
        "stages/rl/filtered_bc.py", "stages/rl/archer.py", "stages/rl/chai.py", "pipeline/text/critic.py",
        "pipeline/text/play.py", "pipeline/text/policies.py", "pipeline/models/training.py", "pipeline/envs",
    ],
    data=["data/train_policy/sft", "data/train_policy/dpo"],
    needs=_needs,
    outs=[Out("data/rl_text", persist=True)],
    plots=[
        Plot("metrics/plots/rl_rounds.json",
             "rl-text, success over environment samples (algorithms compare at equal samples)", x="episodes",
             y="success_rate"),
    ],
    models=["rl_text/model"],
    notes={"pipeline/envs": "the games it plays"},
)
# What each algorithm writes under data/rl_text besides model/; another algorithm's leftovers are removed.
OUTPUT_DIRS = {"filtered_bc": {"rollouts", "rounds", "checkpoints"}, "archer": {"replay", "state", "episodes"},
               "chai": {"replay", "state", "episodes"}}


def run(params: Params, ctx: StageContext) -> StageResult:
    algorithm = params.rl_text.algorithm
    out = params.data_path("rl_text")
    for name in set().union(*OUTPUT_DIRS.values()) - OUTPUT_DIRS[algorithm]:
        shutil.rmtree(out / name, ignore_errors=True)
    return importlib.import_module(f"stages.rl.{algorithm}").run(params, ctx)
