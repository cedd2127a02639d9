"""train-dpo: DPO with RPO's α (TRL DPOTrainer) from ``train_policy.dpo.init`` (the SFT policy by default).

Pairs and their reference log-probs come from ``data/reflogprobs``, which scored them with that same policy: the
reference is the policy DPO starts from (PAPRIKA), so the first loss is log 2 (β-scaled margins of zero) and no
reference model is ever loaded. A stored reference of another policy is refused. → ``data/train_policy/dpo``;
resumes from its ``checkpoints/``.
"""

from __future__ import annotations

from pipeline.core.artifacts import dataset_hash, dir_hash, read_manifest, read_rows
from pipeline.core.checkpoints import finished, keyed_dir, run_key
from pipeline.core.config import ConfigError
from pipeline.core.stage import Out, Plot, Stage, StageContext, StageResult
from pipeline.llm.hf import load_policy
from pipeline.models.training import dpo_train
from pipeline.params import Params
from pipeline.text.policies import policy_deps, require_policy
from stages.train import finish, phase_metrics, write_loss_plot

NAME = "train-dpo"


def _needs(params: Params) -> list[str]:
    return ["data/reflogprobs", *policy_deps(params, params.train_policy.dpo.init, served=False)]  # its init


STAGE = Stage(
    NAME,
    params=["seed", "policy", "train_policy.dpo", "train_policy.lora", "train_policy.save_steps"],
    code=["stages/train.py", "pipeline/models/training.py"],
    data=["data/reflogprobs", "data/bootstrap", "data/train_policy/sft"],
    needs=_needs,
    outs=[Out("data/train_policy/dpo", persist=True)],
    plots=[Plot("metrics/plots/dpo_loss.json", "DPO loss", x="step", y="loss")],
    models=["train_policy/dpo"],
)


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.train_policy
    init = require_policy(params, cfg.dpo.init)
    out = params.data_path("train_policy", "dpo")
    src = params.data_path("reflogprobs")
    manifest = read_manifest(src) or {}
    if manifest.get("upstream", {}).get("reference") != dir_hash(init):
        raise ConfigError(f"data/reflogprobs was not scored by the policy DPO starts from "
                          f"(train_policy.dpo.init={cfg.dpo.init}): run the reflogprobs stage first")
    key = run_key(params.section_hash(STAGE.params), dataset_hash(src), dir_hash(init))
    metrics: dict[str, float] = {}
    if not finished(out, key):
        model, tokenizer = load_policy(init, params.policy.device)
        pairs = read_rows(src)
        ckpt = keyed_dir(out / "checkpoints", key)
        model, history, resumed = dpo_train(
            model, tokenizer, pairs, ckpt, lr=cfg.dpo.lr, epochs=cfg.dpo.epochs, batch_size=cfg.dpo.batch_size,
            beta=cfg.dpo.beta, rpo_alpha=cfg.dpo.rpo_alpha, loss_type=cfg.dpo.loss_type,
            label_smoothing=cfg.dpo.label_smoothing, warmup_ratio=cfg.dpo.warmup_ratio, seed=params.seed,
            save_steps=cfg.save_steps, tracker=ctx.tracker, lora=cfg.lora,
        )
        finish(model, tokenizer, out, ckpt, key, history)
        metrics = phase_metrics("dpo", "pairs", len(pairs), resumed, history)
    write_loss_plot(params.plots_path("dpo_loss.json"), out)
    return StageResult(metrics=metrics, outputs=[str(out)])
