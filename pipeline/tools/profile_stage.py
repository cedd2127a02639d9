"""Where a stage's CPU seconds go (``curio profile``): one stage under cProfile (CPU time, so a shared machine skews
it little).

    curio profile STAGE [-S key=value ...] [--top 25]

Runs the stage in this process, as ``curio stage STAGE`` runs it, and prints the CPU seconds of the buckets that
matter for Curio's stages — model forward passes, the rest of ``generate`` (sampling, stopping, cache bookkeeping),
chat-template tokenization and decoding, the games' steps, the trainer's backward / optimizer steps / batching — then
the top functions by own time. Subprocesses (sample-factory's workers) are not seen; their parent's wait shows instead.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

# (label, (file fragment, function name)) — cumulative CPU seconds; nested buckets are reported as such.
BUCKETS = [
    ("stage total", ("pipeline/core/stage.py", "execute")),
    ("generate (all)", ("generation/utils.py", "generate")),
    ("  sampling loop", ("generation/utils.py", "_sample")),
    ("forward passes (all nn.Module calls)", ("torch/nn/modules/module.py", "_call_impl")),
    ("  KV cache kept across turns", ("pipeline/llm/hf.py", "_keep")),
    ("  KV cache reused", ("pipeline/llm/hf.py", "_past")),
    ("chat template -> tokens", ("transformers/tokenization_utils_base.py", "apply_chat_template")),
    ("decode tokens -> text", ("transformers/tokenization_utils_base.py", "decode")),
    ("games: step_batch", ("pipeline/envs", "step_batch")),
    ("trainer: train loop", ("transformers/trainer.py", "_inner_training_loop")),
    ("  training_step", ("transformers/trainer.py", "training_step")),
    ("    backward", ("torch/_tensor.py", "backward")),
    ("  optimizer step", ("torch/optim/optimizer.py", "wrapper")),
    ("  batches (collate)", ("torch/utils/data/dataloader.py", "__next__")),
    ("  checkpoint saves", ("transformers/trainer.py", "_save_checkpoint")),
    ("dataset map (tokenize)", ("datasets/arrow_dataset.py", "map")),
    ("sample-factory run", ("sample_factory/train.py", "run_rl")),
    ("parquet writes", ("pipeline/core/artifacts.py", "write_rows")),
]


def profile(name: str, params, top: int = 25) -> None:
    """Run stage ``name`` on ``params`` under cProfile; print the buckets' CPU seconds, then the ``top`` functions by
    their own time (to stderr and stdout, as pstats prints)."""
    from pipeline.core.stage import execute  # torch, MLflow and the stage's module: only to run one

    prof = cProfile.Profile(time.process_time)
    t0, c0 = time.perf_counter(), time.process_time()
    prof.enable()
    try:
        execute(name, params)
    finally:
        prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stats = pstats.Stats(prof)
    print(f"\n{name}: {cpu:.1f} CPU s in {wall:.1f} wall s", file=sys.stderr)
    for label, (frag, fn) in BUCKETS:
        total = sum(v[3] for (path, _, func), v in stats.stats.items() if func == fn and frag in path)
        if total >= 0.05:
            print(f"  {label:<32} {total:8.1f} s  {100 * total / cpu:5.1f} %", file=sys.stderr)
    stats.sort_stats("tottime").print_stats(top)
