"""Choose how a pretrained chat model is taught the answer format, on the validation split, never on held-out tasks.

    OMP_NUM_THREADS=1 python bench/choose_format_prompt.py --preset presets/smollm2.yaml [--k 2] [-S key=value]

For each candidate, a ``policy.format_prompt`` (``game``, ``rule``, ``example``: pipeline/envs/base.py
``format_note``), ``+free`` for ``policy.free_answers`` (a reply without tags is read as a move), the untrained base
policy (``policy.model``) plays every ``val`` task (``games.val_fraction`` of the train tasks, capped by
``games.max_eval_tasks``) k times with the evaluation sampling. Prints, per candidate, val success ± standard
error, the share of the policy's replies that parsed as ``<Answer>…</Answer>``, the share of episodes ended by
unparseable replies, mean turns; then the choice: highest val success, then most parsed replies. Nothing is
written under data/.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CANDIDATES = ("game", "rule", "example", "game+free", "rule+free", "example+free")


def score(rows: list[dict]) -> dict:
    """Success ± standard error, parsed share of replies (format retries are unparsed replies), invalid share."""
    from pipeline.text.play import summarize

    s = summarize(rows)
    p, n = s["success_rate"], s["episodes"]
    replies = sum(r["turns"] + r["format_retries"] for r in rows)
    return {**s, "se": math.sqrt(p * (1 - p) / n) if n else 0.0,
            "parsed": sum(r["turns"] for r in rows) / replies if replies else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default=None, help="a params preset, e.g. presets/smollm2.yaml")
    ap.add_argument("-S", dest="overrides", action="append", default=[], help="params override, key=value")
    ap.add_argument("--k", type=int, default=2, help="samples per val task")
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    ap.add_argument("--json", type=Path, default=None, help="also write the table here")
    args = ap.parse_args()

    from pipeline.core.config import preset_overrides
    from pipeline.params import load_params
    from stages.evaluate import evaluate_policy

    base = (preset_overrides(args.preset) if args.preset else []) + args.overrides
    results = {}
    for cand in args.candidates.split(","):
        prompt, _, free = cand.partition("+")
        params = load_params(REPO / "params.yaml", [*base, f"policy.format_prompt={prompt}",
                                                    f"policy.free_answers={str(free == 'free').lower()}"])
        if params.games.val_fraction <= 0:
            raise SystemExit("set games.val_fraction > 0 (preset or -S): the choice is made on the val split")
        t0 = time.perf_counter()
        rows = evaluate_policy(params, "base", "val", seed=params.seed, k=args.k,
                               temperature=params.evaluate_text.temperature)
        results[cand] = {**score(rows), "seconds": time.perf_counter() - t0}
        r = results[cand]
        print(f"{cand:12s} val success {r['success_rate']:.3f} ± {r['se']:.3f}  parsed replies {r['parsed']:.3f}  "
              f"invalid episodes {r['invalid_rate']:.3f}  mean turns {r['mean_turns']:.1f}  "
              f"({r['episodes']} episodes, {r['seconds']:.0f} s)", flush=True)
    best = max(results, key=lambda c: (results[c]["success_rate"], results[c]["parsed"]))
    prompt, _, free = best.partition("+")
    print(f"chosen on val: policy.format_prompt={prompt} policy.free_answers={str(free == 'free').lower()}")
    if args.json:
        args.json.write_text(json.dumps({"chosen": best, "results": results}, indent=1))


if __name__ == "__main__":
    main()
