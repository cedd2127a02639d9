"""train-sft: assistant-only SFT (TRL SFTTrainer) on the best trajectories, from the base policy.

``data/pairs_text/sft`` → ``data/train_policy/sft``. With ``train_policy.lora.enabled`` only LoRA adapters train
and the merged (plain) model is saved. Resumes from ``data/train_policy/sft/checkpoints``.
"""

from __future__ import annotations

from pipeline.core.artifacts import dataset_hash, dir_hash, read_rows
from pipeline.core.checkpoints import finished, keyed_dir, run_key
from pipeline.core.stage import Out, Plot, Stage, StageContext, StageResult
from pipeline.llm.hf import load_policy
from pipeline.models.phases import finish, kept_metrics, phase_metric_help, phase_metrics, write_loss_plot
from pipeline.models.training import sft_train
from pipeline.params import Params
from pipeline.text.policies import policy_deps, require_policy

NAME = "train-sft"


def _needs(params: Params) -> list[str]:
    return ["data/pairs_text", *policy_deps(params.policy, "base", served=False)]  # trained from the base policy


METRIC_HELP = phase_metric_help("sft", "trajectories", "SFT trajectories")

STAGE = Stage(
    NAME,
    params=["seed", "policy", "train_policy.sft", "train_policy.lora", "train_policy.save_steps"],
    code=["pipeline/models/phases.py", "pipeline/models/training.py", "pipeline/models/chat.py"],
    data=["data/pairs_text", "data/bootstrap"],
    needs=_needs,
    outs=[Out("data/train_policy/sft", persist=True)],
    plots=[Plot("metrics/plots/sft_loss.json", "SFT loss", x="step", y="loss")],
    models=["train_policy/sft"],
    doc=("The policy trains in two stages around reflogprobs: its reference is the policy DPO starts from "
         "(train_policy.dpo.init, SFT by default), so it scores the pairs after train-sft (PAPRIKA)."),
    metric_help=METRIC_HELP,
)


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.train_policy
    base = require_policy(params, "base")
    out = params.data_path("train_policy", "sft")
    src = params.data_path("pairs_text", "sft")
    key = run_key(params.section_hash(STAGE.params), dataset_hash(src), dir_hash(base))
    trained: dict[str, float] = {}
    if not finished(out, key):
        model, tokenizer = load_policy(base, params.policy.device)
        conversations = [r["messages"] for r in read_rows(src, ["messages"])]
        ckpt = keyed_dir(out / "checkpoints", key)
        model, history, resumed = sft_train(
            model, tokenizer, conversations, ckpt, lr=cfg.sft.lr, epochs=cfg.sft.epochs,
            batch_size=cfg.sft.batch_size, warmup_ratio=cfg.sft.warmup_ratio, seed=params.seed,
            save_steps=cfg.save_steps, tracker=ctx.tracker, prefix="sft", lora=cfg.lora,
        )
        trained = phase_metrics("sft", "trajectories", len(conversations), resumed, history)
        finish(model, tokenizer, out, ckpt, key, history, trained)
    metrics = kept_metrics(out) | trained  # what it reported when it trained, also when finished before this run
    write_loss_plot(params.plots_path("sft_loss.json"), out)
    return StageResult(metrics=metrics, outputs=[str(out)])
