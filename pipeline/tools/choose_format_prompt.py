"""Choose how a pretrained chat model is taught the answer format, on the validation split, never on held-out tasks
(``curio choose format-prompt``).

For each candidate, a ``policy.format_prompt`` (``game``, ``rule``, ``example``: pipeline/envs/base.py
``format_note``), ``+free`` for ``policy.free_answers`` (a reply without tags is read as a move), the untrained base
policy (``policy.model``) plays every ``val`` task (``games.val_fraction`` of the train tasks, capped by
``games.max_eval_tasks``) k times with the evaluation sampling. Prints, per candidate, val success ± standard
error, the share of the policy's replies that parsed as ``<Answer>…</Answer>``, the share of episodes ended by
unparseable replies, mean turns; then the choice: highest val success, then most parsed replies. Nothing is
written under data/.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from pipeline.core.config import preset_overrides
from pipeline.params import load_params
from pipeline.text.play import summarize
from pipeline.tools import REPO, ToolError, require_val_split

CANDIDATES = ("game", "rule", "example", "game+free", "rule+free", "example+free")


def score(rows: list[dict]) -> dict:
    """Success ± standard error, parsed share of replies (format retries are unparsed replies), invalid share."""
    s = summarize(rows)
    p, n = s["success_rate"], s["episodes"]
    replies = sum(r["turns"] + r["format_retries"] for r in rows)
    return {**s, "se": math.sqrt(p * (1 - p) / n) if n else 0.0,
            "parsed": sum(r["turns"] for r in rows) / replies if replies else 0.0}


def choose_format_prompt(preset: str | None, overrides: list[str], k: int, candidates: list[str],
                         json_out: Path | None = None) -> str:
    """Play every candidate on val, print its line and the choice; the candidate chosen."""
    from stages.evaluate_text import evaluate_policy  # the policy backends (torch): only to play

    candidates = [c for c in candidates if c]
    if not candidates:
        raise ToolError("--candidates: no candidate given")
    base = (preset_overrides(preset) if preset else []) + overrides
    results = {}
    for cand in candidates:
        prompt, _, free = cand.partition("+")
        if free not in ("", "free"):
            raise ToolError(f"--candidates: {cand!r} is not FORMAT_PROMPT or FORMAT_PROMPT+free")
        params = load_params(REPO / "params.yaml", [*base, f"policy.format_prompt={prompt}",
                                                    f"policy.free_answers={str(free == 'free').lower()}"])
        require_val_split(params)
        t0 = time.perf_counter()
        rows = evaluate_policy(params, "base", "val", seed=params.eval_seed, k=k,
                               temperature=params.evaluate_text.temperature)
        results[cand] = {**score(rows), "seconds": time.perf_counter() - t0}
        r = results[cand]
        print(f"{cand:12s} val success {r['success_rate']:.3f} ± {r['se']:.3f}  parsed replies {r['parsed']:.3f}  "
              f"invalid episodes {r['invalid_rate']:.3f}  mean turns {r['mean_turns']:.1f}  "
              f"({r['episodes']} episodes, {r['seconds']:.0f} s)", flush=True)
    best = max(results, key=lambda c: (results[c]["success_rate"], results[c]["parsed"]))
    prompt, _, free = best.partition("+")
    print(f"chosen on val: policy.format_prompt={prompt} policy.free_answers={str(free == 'free').lower()}")
    if json_out:
        json_out.write_text(json.dumps({"chosen": best, "results": results}, indent=1))
    return best
