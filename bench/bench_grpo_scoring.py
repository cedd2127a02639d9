"""What GRPO's scoring costs and what it moves, on SmolLM2, side by side on the same episodes.

    OMP_NUM_THREADS=2 python bench/bench_grpo_scoring.py [--tasks 4] [--min-p 0.3]

SmolLM2-135M-Instruct (``curio models import-gguf``'s directory, imported once) plays ``--tasks`` tasks of
twenty_questions@shown4 × K = ``rl_text.trajectories_per_task`` from ids, as rl-text's rounds sample by default
(``rl_text.sampling``: temperature 1, no truncation), and once more with PAPRIKA's min-p (``--min-p``). On each set of
episodes it prints:

- **the share of reply tokens whose log-prob can get a gradient**, scored as rl-text scores now (the untruncated
  temperature softmax: every token with p < 1) and as it scored before (the sampler's min-p-truncated, renormalised
  distribution: a token the filter kept alone has log-prob 0 under any weights that keep it alone);
- **the seconds of GRPO's update** (``pipeline.rl_text.grpo.update``, LoRA as the preset trains), split into the
  no-grad scoring pass that gives π_old and the optimizer steps, and the pass's share of the whole;
- the sampler / trainer gap the rollout correction sees.

The ratios are of one run on this machine; name the CPU when quoting them.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def truncated_zero_share(model, rows, min_p: float) -> float:
    """The share of the rows' reply tokens whose log-prob under the min-p-truncated, renormalised distribution is 0
    (the token was the only one min-p kept): what the old scoring could not move."""
    import torch
    from transformers import MinPLogitsWarper

    from pipeline.text.grpo import decoder_and_head, pack_episode

    body, head = decoder_and_head(model)
    zero = total = 0
    warp = MinPLogitsWarper(min_p=min_p)
    with torch.no_grad():
        for row in rows:
            for seq in pack_episode(list(zip(row["reply_prompt_ids"], row["reply_token_ids"], strict=True))):
                ids = torch.tensor(seq.ids)[None]
                hidden = body(input_ids=ids, use_cache=False).last_hidden_state[0]
                for start, length in seq.replies:
                    at = torch.arange(start - 1, start - 1 + length)
                    scores = warp(None, head(hidden[at]).float())
                    logp = torch.log_softmax(scores, -1).gather(-1, ids[0, at + 1][:, None]).squeeze(-1)
                    zero += int((logp == 0).sum())
                    total += length
    return zero / max(1, total)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=4, help="tasks of twenty_questions@shown4 (K episodes each)")
    ap.add_argument("--min-p", type=float, default=0.3, help="the truncation the second side keeps (PAPRIKA: 0.3)")
    args = ap.parse_args()
    os.chdir(REPO)

    import torch
    from peft import get_peft_model

    from pipeline.llm.base import Sampling
    from pipeline.llm.hf import HFBackend, load_policy
    from pipeline.models.gguf import DEFAULT_DIR, import_once, smollm2_gguf
    from pipeline.models.training import peft_config
    from pipeline.params import load_params
    from pipeline.rl_text.grpo import update
    from pipeline.rl_text.rounds import round_sampling
    from pipeline.text.play import play_episodes
    from pipeline.text.policies import make_games

    import_once(smollm2_gguf(), REPO / DEFAULT_DIR)
    params = load_params("params.yaml", ["policy.free_answers=true", "games.groups=[twenty_questions@shown4]",
                                         "rollout_text.max_new_tokens=24", "rl_text.algorithm=grpo",
                                         "rl_text.reward=infogain", "rl_text.lora=true", "tracking.enabled=false"])
    game = make_games(params)[0]
    k = params.rl_text.trajectories_per_task
    jobs = [(game, t, s) for t in game.tasks("train")[: args.tasks] for s in range(k)]
    default = round_sampling(params.rl_text.sampling, params.rollout_text.max_new_tokens)
    sides = {"untruncated (rl_text.sampling)": default,
             f"min-p {args.min_p} kept": Sampling(temperature=default.temperature, min_p=args.min_p, top_k=0,
                                                  max_tokens=default.max_tokens)}
    from pipeline.text.turn_rewards import InfogainTurnRewards

    threads = os.environ.get("OMP_NUM_THREADS", "(default)")
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
          f"{torch.backends.cpu.get_cpu_capability()}, OMP_NUM_THREADS={threads}")
    print("| sampled | episodes | reply tokens | moving, scored now | moving, scored truncated (before) | "
          "π_old pass s | optimizer steps s | pass share | gap mean | gap max |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, sampling in sides.items():
        model, tok = load_policy(REPO / DEFAULT_DIR)
        rows = play_episodes(HFBackend(REPO / DEFAULT_DIR, model_obj=model, tokenizer=tok), jobs, sampling, seed=0,
                             token_ids=True)
        dense = InfogainTurnRewards(params)(None, tok, [game], rows, 0, 0)
        rows = [{**r, "turn_rewards": d} for r, d in zip(rows, dense, strict=True)]
        zero = truncated_zero_share(model, rows, args.min_p)
        peft = get_peft_model(model, peft_config(params.train_policy.lora, model))
        start = time.perf_counter()
        stats = update(peft, tok, rows, {game.name: game}, params.rl_text, params.rollout_text.max_new_tokens, 0)
        whole = time.perf_counter() - start
        tokens = sum(len(t) for r in rows for t in r["reply_token_ids"])
        got = {k: stats.get(f"grpo/{k}", 0.0) for k in ("moving", "old_pass_s", "update_s", "mismatch/gap_mean",
                                                           "mismatch/gap_max")}
        print(f"| {name} | {len(rows)} | {tokens} | {100 * got['moving']:.1f} % | {100 * (1 - zero):.1f} % | "
              f"{got['old_pass_s']:.2f} | {got['update_s']:.2f} | {100 * got['old_pass_s'] / whole:.0f} % | "
              f"{got['mismatch/gap_mean']:.2e} | {got['mismatch/gap_max']:.2e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
