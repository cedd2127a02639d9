"""Where a stage's CPU seconds go: one stage under cProfile (CPU time, so a shared machine skews it little).

    python bench/profile_stage.py STAGE [-S key=value ...] [--top 25]

Runs ``curio stage STAGE`` in this process and prints the CPU seconds of the buckets that matter for Curio's
stages — model forward passes, the rest of ``generate`` (sampling, stopping, cache bookkeeping), chat-template
tokenization and decoding, the games' steps, the trainer's backward / optimizer steps / batching — then the top
functions by own time. Subprocesses (sample-factory's workers) are not seen; their parent's wait shows instead.
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("stage")
    ap.add_argument("-S", "--set", action="append", default=[])
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    from pipeline.cli import app

    prof = cProfile.Profile(time.process_time)
    t0, c0 = time.perf_counter(), time.process_time()
    argv = ["stage", args.stage, *[x for s in args.set for x in ("-S", s)]]
    prof.enable()
    try:
        app(argv, standalone_mode=False)
    finally:
        prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stats = pstats.Stats(prof)
    print(f"\n{args.stage}: {cpu:.1f} CPU s in {wall:.1f} wall s ({' '.join(argv)})", file=sys.stderr)
    for label, (frag, fn) in BUCKETS:
        total = sum(v[3] for (path, _, name), v in stats.stats.items() if name == fn and frag in path)
        if total >= 0.05:
            print(f"  {label:<32} {total:8.1f} s  {100 * total / cpu:5.1f} %", file=sys.stderr)
    stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
