"""train-dpo: DPO with RPO's α (TRL DPOTrainer) from ``train_policy.dpo.init`` (the SFT policy by default).

Pairs and their reference log-probs come from ``data/reflogprobs``, which scored them with that same policy: the
reference is the policy DPO starts from (PAPRIKA), so the first loss is log 2 (β-scaled margins of zero) and no
reference model is ever loaded. A stored reference of another policy is refused. → ``data/train_policy/dpo``;
resumes from its ``checkpoints/``.

Once trained, the policy scores every pair again (the log-probs reflogprobs computes, summed over the assistant
tokens) → ``data/train_policy/dpo_margins``: per pair its log-probs under the trained policy and the implicit reward
margin β·[(log π − log π_ref)(chosen) − (log π − log π_ref)(rejected)] (TRL's ``rewards/margins``), chunked and
resumable; the report shows their mean, the pairs page each pair's.
"""

from __future__ import annotations

from functools import partial

import pyarrow as pa

from pipeline.core.artifacts import dataset_hash, dir_hash, read_manifest, read_rows, read_table
from pipeline.core.checkpoints import finished, keyed_dir, run_key
from pipeline.core.config import ConfigError
from pipeline.core.runners import ChunkJob, run_chunked
from pipeline.core.stage import Out, Plot, Stage, StageContext, StageResult
from pipeline.llm.hf import load_policy
from pipeline.models.phases import finish, kept_metrics, phase_metric_help, phase_metrics, write_loss_plot
from pipeline.models.training import dpo_train, implicit_margins, sequence_logps
from pipeline.params import Params
from pipeline.text.policies import policy_deps, require_policy

NAME = "train-dpo"


def _needs(params: Params) -> list[str]:
    return ["data/reflogprobs", *policy_deps(params.policy, params.train_policy.dpo.init, served=False)]  # its init


METRIC_HELP = {
    **phase_metric_help("dpo", "pairs", "preference pairs"),
    "dpo/pairs_scored": "pairs the trained policy's implicit reward margin was computed on",
    "dpo/mean_implicit_margin": "mean implicit reward margin, beta x (policy - reference log-ratio of chosen minus "
                                "rejected)",
    "dpo/implicit_accuracy": "share of the pairs whose margin is positive (the policy prefers the chosen reply)",
}

STAGE = Stage(
    NAME,
    params=["seed", "policy", "train_policy.dpo", "train_policy.lora", "train_policy.save_steps"],
    code=["pipeline/models/phases.py", "pipeline/models/training.py"],
    data=["data/reflogprobs", "data/bootstrap", "data/train_policy/sft"],
    needs=_needs,
    outs=[Out("data/train_policy/dpo", persist=True),
          Out("data/train_policy/dpo_margins", persist=True,
              note="the trained policy's implicit reward margin on every pair")],
    plots=[Plot("metrics/plots/dpo_loss.json", "DPO loss", x="step", y="loss")],
    models=["train_policy/dpo"],
    metric_help=METRIC_HELP,
)
PAIRS_PER_CHUNK = 2048
MARGIN_SCHEMA = pa.schema([
    pa.field("pair", pa.int64()),  # the pair's row in data/reflogprobs
    pa.field("group", pa.string()),
    pa.field("task_id", pa.string()),
    pa.field("policy_chosen_logps", pa.float64()),  # log π(chosen), summed over its assistant tokens
    pa.field("policy_rejected_logps", pa.float64()),
    pa.field("implicit_margin", pa.float64()),  # β·[(log π − log π_ref)(chosen) − (log π − log π_ref)(rejected)]
    pa.field("prefers_chosen", pa.bool_()),  # implicit_margin > 0 (TRL's rewards/accuracies)
])
SCORED = ["group", "task_id", "prompt_ids", "chosen_ids", "chosen_mask", "rejected_ids", "rejected_mask",
          "ref_chosen_logps", "ref_rejected_logps"]


def margin_chunk(beta: float, batch_size: int, device: str, state: tuple, index: int, pairs: list[dict]) -> list[dict]:
    """The trained policy's log-probs of one chunk of pairs and their implicit reward margins."""
    model, _ = state
    chosen = sequence_logps(model, [(p["prompt_ids"], p["chosen_ids"], p["chosen_mask"]) for p in pairs],
                            batch_size, device)
    rejected = sequence_logps(model, [(p["prompt_ids"], p["rejected_ids"], p["rejected_mask"]) for p in pairs],
                              batch_size, device)
    margins = implicit_margins(chosen, rejected, [p["ref_chosen_logps"] for p in pairs],
                               [p["ref_rejected_logps"] for p in pairs], beta)
    return [{"pair": index * PAIRS_PER_CHUNK + i, "group": p["group"], "task_id": p["task_id"],
             "policy_chosen_logps": c, "policy_rejected_logps": j, "implicit_margin": m, "prefers_chosen": m > 0}
            for i, (p, c, j, m) in enumerate(zip(pairs, chosen, rejected, margins, strict=True))]


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
    trained: dict[str, float] = {}
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
        trained = phase_metrics("dpo", "pairs", len(pairs), resumed, history)
        finish(model, tokenizer, out, ckpt, key, history, trained)
        del model  # scored below as saved (a finished phase skipped above has only that)
    metrics = kept_metrics(out) | trained  # what it reported when it trained, also when finished before this run
    write_loss_plot(params.plots_path("dpo_loss.json"), out)

    margins = params.data_path("train_policy", "dpo_margins")
    pairs = read_rows(src, SCORED)
    chunks = [pairs[i : i + PAIRS_PER_CHUNK] for i in range(0, len(pairs), PAIRS_PER_CHUNK)]
    run_chunked(margins, num_chunks=len(chunks), schema=MARGIN_SCHEMA, desc="implicit reward margins",
                make_chunk=ChunkJob(run=partial(margin_chunk, cfg.dpo.beta, cfg.dpo.batch_size, params.policy.device),
                                    inputs=chunks, load=partial(load_policy, out, params.policy.device)),
                params_hash=params.section_hash(STAGE.params),
                upstream={"pairs": dataset_hash(src), "policy": dir_hash(out)})
    scored = read_table(margins, ["implicit_margin", "prefers_chosen"]).to_pydict()
    n = max(1, len(scored["implicit_margin"]))
    metrics |= {"dpo/pairs_scored": len(scored["implicit_margin"]),
                "dpo/mean_implicit_margin": sum(scored["implicit_margin"]) / n,
                "dpo/implicit_accuracy": sum(scored["prefers_chosen"]) / n}
    return StageResult(metrics=metrics, outputs=[str(out), str(margins)])
