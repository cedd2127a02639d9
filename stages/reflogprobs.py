"""reflogprobs: reference-policy log-probs of every pair's chosen and rejected conversation, computed once.

log π_ref(y|x) = sum of token log-probs over the assistant content tokens of the whole multi-turn completion
(environment turns and end-of-turn template tokens masked). Stored with the tokenized pair (variable length,
no padding on disk) as ``ref_chosen_logps`` / ``ref_rejected_logps`` so train-dpo never loads a reference
model. The reference is the policy DPO starts from, ``train_policy.dpo.init`` (the SFT policy by default, so this
stage runs after train-sft), as in PAPRIKA: DPO's first loss is then log 2.
"""

from __future__ import annotations

from functools import partial

from tqdm.auto import tqdm

from pipeline.core.artifacts import dataset_hash, dir_hash, read_rows
from pipeline.core.runners import ChunkJob, run_chunked
from pipeline.core.stage import Out, Stage, StageContext, StageResult
from pipeline.llm.hf import load_policy
from pipeline.models.training import sequence_logps, tokenize_pair
from pipeline.params import Params
from pipeline.text.policies import policy_deps, require_policy

NAME = "reflogprobs"


def _needs(params: Params) -> list[str]:
    return ["data/pairs_text", *policy_deps(params.policy, params.train_policy.dpo.init, served=False)]  # the reference


METRIC_HELP = {
    "pairs": "preference pairs scored by the reference policy (train_policy.dpo.init)",
    "mean_ref_chosen_logps": "mean log-probability of the chosen replies under the reference policy",
    "mean_ref_rejected_logps": "mean log-probability of the rejected replies under it",
}

STAGE = Stage(
    NAME,
    params=["policy", "reflogprobs", "train_policy.dpo.init"],  # scoring is deterministic: no seed
    code=["pipeline/models/training.py", "pipeline/models/chat.py"],
    data=["data/pairs_text", "data/bootstrap", "data/train_policy/sft"],
    needs=_needs,
    outs=[Out("data/reflogprobs", persist=True)],
    notes={"data/bootstrap": "the reference when train_policy.dpo.init is base",
           "data/train_policy/sft": "the reference when train_policy.dpo.init is sft (the default)"},
    metric_help=METRIC_HELP,
)
PAIRS_PER_CHUNK = 2048


def annotate_pairs(model, tokenizer, pairs: list[dict], batch_size: int, device: str = "cpu") -> list[dict]:
    rows = []
    for p in tqdm(pairs, desc="tokenizing pairs", leave=False):
        rows.append({**p, **tokenize_pair(tokenizer, p["prompt"], p["chosen"], p["rejected"])})
    chosen = sequence_logps(model, [(r["prompt_ids"], r["chosen_ids"], r["chosen_mask"]) for r in rows],
                            batch_size, device)
    rejected = sequence_logps(model, [(r["prompt_ids"], r["rejected_ids"], r["rejected_mask"]) for r in rows],
                              batch_size, device)
    for r, c, j in zip(rows, chosen, rejected, strict=True):
        r["ref_chosen_logps"], r["ref_rejected_logps"] = c, j
    return rows


def masked_sums(backend, sequences: list[tuple[list[int], list[int], list[int]]]) -> list[float]:
    """:func:`sequence_logps` on a vLLM server: the sum of log π(token) over the masked completion tokens of
    each (prompt_ids, completion_ids, mask), from the engine's ``prompt_logprobs`` of the ids as given."""
    scored = backend.prompt_logprobs([p + c for p, c, _ in sequences])
    return [sum(lp for lp, keep in zip(logps[len(p) - 1:], m, strict=True) if keep)
            for logps, (p, _, m) in zip(scored, sequences, strict=True)]


def vllm_pairs(backend, tokenizer, pairs: list[dict]) -> list[dict]:
    rows = [{**p, **tokenize_pair(tokenizer, p["prompt"], p["chosen"], p["rejected"])} for p in pairs]
    for side in ("chosen", "rejected"):
        logps = masked_sums(backend, [(r["prompt_ids"], r[f"{side}_ids"], r[f"{side}_mask"]) for r in rows])
        for r, lp in zip(rows, logps, strict=True):
            r[f"ref_{side}_logps"] = lp
    return rows


def load_vllm_reference(params: Params, ref_path: str) -> tuple:
    """The reference on vLLM's server (float32, as the hf path scores) and its tokenizer."""
    from transformers import AutoTokenizer

    from pipeline.llm.vllm import VLLMBackend

    cfg = params.reflogprobs
    backend = VLLMBackend(ref_path, cfg.base_url, device=params.policy.device, dtype="float32",
                          max_concurrency=8, timeout_s=600.0)
    return backend, AutoTokenizer.from_pretrained(ref_path)


def reference_chunk(params: Params, state: tuple, _index: int, pairs: list[dict]) -> list[dict]:
    model, tokenizer = state
    if params.reflogprobs.backend == "vllm":
        return vllm_pairs(model, tokenizer, pairs)
    return annotate_pairs(model, tokenizer, pairs, params.reflogprobs.batch_size, params.policy.device)


def run(params: Params, ctx: StageContext) -> StageResult:
    src = params.data_path("pairs_text", "preferences")
    out = params.data_path("reflogprobs")
    ref_path = require_policy(params, params.train_policy.dpo.init)
    pairs = read_rows(src)
    chunks = [pairs[i : i + PAIRS_PER_CHUNK] for i in range(0, len(pairs), PAIRS_PER_CHUNK)]
    run_chunked(
        out, num_chunks=len(chunks),  # the reference model is loaded once per process that computes chunks
        make_chunk=ChunkJob(run=partial(reference_chunk, params), inputs=chunks,
                            load=partial(load_vllm_reference, params, ref_path) if params.reflogprobs.backend == "vllm"
                            else partial(load_policy, ref_path, params.policy.device)),
        params_hash=params.section_hash(STAGE.params),
        upstream={"pairs": dataset_hash(src), "reference": dir_hash(ref_path)},
        desc="reference log-probs",
    )
    rows = read_rows(out, ["ref_chosen_logps", "ref_rejected_logps"])
    n = max(1, len(rows))
    return StageResult(metrics={
        "pairs": len(rows),
        "mean_ref_chosen_logps": sum(r["ref_chosen_logps"] for r in rows) / n,
        "mean_ref_rejected_logps": sum(r["ref_rejected_logps"] for r in rows) / n,
    }, outputs=[str(out)])
