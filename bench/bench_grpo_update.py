"""GRPO's update and val pass against another revision of the code, side by side, on the same episodes.

    OMP_NUM_THREADS=2 python bench/bench_grpo_update.py --run DIR --before REF [--tasks 8] [--val-tasks 24]
                                                        [--repeats 2]

``DIR`` is the checkout of a finished run of ``presets/smollm2-learn.yaml`` (its params.yaml and DPO policy);
``REF`` a commit of this repository (checked out into a temporary worktree). Once, the DPO policy plays the first
``--tasks`` train tasks of the run (K episodes each, the preset's sampling, token in / token out); then, in a fresh
process per side and repeat (alternating), each side times:

- **update**: GRPO's update of those episodes (``pipeline.rl_text.grpo.update``, LoRA as the preset trains): seconds per
  trained reply. Both sides train on the same played ids (``REF``'s code re-renders each prompt from the text, as
  it did);
- **val**: ``--val-tasks`` val tasks × ``rl_text.val_trajectories`` played as the stage's val pass plays them
  (``pipeline.rl_text.grpo.val_success``): seconds per episode;
- **evaluate-text**: the DPO policy on ``--eval-tasks`` held-out tasks × ``evaluate_text.trajectories_per_task``,
  as evaluate-text plays each policy (its ``evaluate_policy``, the policy loaded as it loads it): seconds per episode.
  The preset's full val pass and evaluation (``--val-tasks 116 --eval-tasks 129``) keep more conversations in play
  than smaller ones, so they also time the KV cache under its budget (``policy.kv_cache_gib``).

A key of the run's params.yaml that ``REF``'s code does not know (one added since) is left out of ``REF``'s side, which
then runs with what that code has instead; the keys left out are printed.

Prints each side's medians and before ÷ after.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def grpo_module():
    """rl-text's GRPO module of the code on ``sys.path`` (a revision before the stage moves kept it in stages/)."""
    import importlib

    try:
        return importlib.import_module("pipeline.rl_text.grpo")
    except ModuleNotFoundError:
        return importlib.import_module("stages.rl.grpo")


def evaluate_module():
    """evaluate-text's stage module of the code on ``sys.path`` (stages/evaluate.py before the stage renames)."""
    import importlib

    try:
        return importlib.import_module("stages.evaluate_text")
    except ModuleNotFoundError:
        return importlib.import_module("stages.evaluate")


def player(policy_player, params):
    """The code on ``sys.path``'s ``PolicyPlayer``: of the policy section and the batch size, or (before they were
    passed) of the whole params."""
    if "batch_size" in inspect.signature(policy_player).parameters:
        return policy_player(params.policy, params.rollout_text.batch_size)
    return policy_player(params)


def val_jobs(rounds, params, game_list: list) -> list:
    """``val_jobs_of`` of the code on ``sys.path``: from the games and rl_text sections, or (before they were passed)
    from the whole params."""
    if "games_cfg" in inspect.signature(rounds.val_jobs_of).parameters:
        return rounds.val_jobs_of(params.games, params.rl_text, game_list)
    return rounds.val_jobs_of(params, game_list)


def grpo_update(grpo, model, tokenizer, rows: list[dict], games: dict, params) -> dict:
    """GRPO's ``update`` of the code on ``sys.path``: of the rl_text section and the reply budget, or (before they
    were passed) of the whole params."""
    if "max_new_tokens" in inspect.signature(grpo.update).parameters:
        return grpo.update(model, tokenizer, rows, games, params.rl_text, params.rollout_text.max_new_tokens, 0)
    return grpo.update(model, tokenizer, rows, games, params, 0)


def accepted_params(run: Path, scratch: Path) -> tuple[Path, list[str]]:
    """A params file the code on ``sys.path`` reads: the run's params.yaml, less each key that code refuses as
    unknown (a key added after ``REF``), written into ``scratch``; and those keys."""
    import re

    import yaml

    from pipeline.core.config import ConfigError
    from pipeline.params import load_params

    path, raw, dropped = run / "params.yaml", None, []
    while True:
        try:
            load_params(path)
            return path, dropped
        except ConfigError as e:
            unknown = re.match(r"params: ([\w.]+): unknown key", str(e))
            if not unknown:
                raise
            raw = raw or yaml.safe_load(path.read_text())
            *parents, leaf = unknown.group(1).split(".")
            section = raw
            for key in parents:
                section = section[key]
            del section[leaf]
            dropped.append(unknown.group(1))
            path = scratch / f"params-{os.getpid()}.yaml"
            path.write_text(yaml.safe_dump(raw, sort_keys=False))


def child(run: Path, rows_file: Path, val_tasks: int, eval_tasks: int) -> dict:
    """One side's timings, with the code on ``sys.path`` (this checkout or the other revision's)."""
    import pyarrow.parquet as pq
    import torch
    from peft import get_peft_model

    from pipeline.llm.hf import load_policy
    from pipeline.models.training import peft_config
    from pipeline.params import load_params
    from pipeline.text.policies import make_games
    grpo = grpo_module()

    path, dropped = accepted_params(run, rows_file.parent)  # the bench's temporary directory
    params = load_params(path, [f"data_dir={run / 'data'}", "tracking.enabled=false"])
    rows = pq.read_table(rows_file).to_pylist()
    if "reply_token_ids" not in grpo.GRPO_SCHEMA.names:  # the code before token-in / token-out play
        rows = [{**r, "turn_token_ids": [ids for ids, ok in zip(r["reply_token_ids"], r["reply_parsed"], strict=True)
                                         if ok]} for r in rows]
    game_list = make_games(params)
    games = {g.name: g for g in game_list}
    dpo = params.data_path("train_policy", "dpo")
    model, tokenizer = load_policy(dpo, params.policy.device)
    model = get_peft_model(model, peft_config(params.train_policy.lora, model))
    start = time.perf_counter()
    stats = grpo_update(grpo, model, tokenizer, rows, games, params)
    update_s = time.perf_counter() - start
    model = model.merge_and_unload().eval()
    # the val pass: pipeline/rl_text/rounds.py's since the rounds were shared, grpo's before
    rounds = grpo if hasattr(grpo, "val_jobs_of") else importlib.import_module("pipeline.rl_text.rounds")
    val = val_jobs(rounds, params, game_list)
    cap = val_tasks // max(1, len(game_list))
    val = [j for g in game_list for j in [v for v in val if v[0] is g][:cap]]
    start = time.perf_counter()
    try:  # the val pass plays on the configured backend (pipeline.rl_text.serving), or on hf before it
        from pipeline.rl_text.serving import PolicyPlayer

        success = rounds.val_success(params, player(PolicyPlayer, params).backend(dpo, model, tokenizer), val)
    except ModuleNotFoundError:
        success = rounds.val_success(params, model, tokenizer, dpo, val)
    val_s = time.perf_counter() - start
    episodes = len(val) * (getattr(params.rl_text, "val_trajectories", None) or params.rl_text.grpo.val_trajectories)
    evaluate = evaluate_module()
    held_out = load_params(path, [f"data_dir={run / 'data'}", "tracking.enabled=false",
                                  f"games.max_eval_tasks={max(1, eval_tasks // len(game_list))}"])
    start = time.perf_counter()
    rows = evaluate.evaluate_policy(held_out, "dpo", "eval", 0, held_out.evaluate_text.trajectories_per_task,
                                    held_out.evaluate_text.temperature)
    eval_s = time.perf_counter() - start
    return {"update_s": update_s, "replies": stats["grpo/replies"], "val_s": val_s, "val_episodes": episodes,
            "val_success": success, "eval_s": eval_s, "eval_episodes": len(rows),
            "eval_success": sum(r["success"] for r in rows) / max(1, len(rows)),
            "capability": torch.backends.cpu.get_cpu_capability(), "gap_mean": stats.get("grpo/mismatch/gap_mean"),
            "dropped": dropped}


def play(run: Path, tasks: int, out: Path) -> int:
    """The DPO policy plays the run's first ``tasks`` train tasks, token in / token out; rows to ``out``."""
    import pyarrow.parquet as pq

    from pipeline.core.artifacts import chunk_seed
    from pipeline.llm import sampling_from_config
    from pipeline.llm.hf import load_policy
    from pipeline.params import load_params
    from pipeline.rl_text.grpo import GRPO_SCHEMA
    from pipeline.rl_text.rounds import train_jobs
    from pipeline.rl_text.serving import PolicyPlayer
    from pipeline.text.play import play_episodes
    from pipeline.text.policies import make_games

    params = load_params(run / "params.yaml", [f"data_dir={run / 'data'}", "tracking.enabled=false"])
    games = make_games(params)
    jobs = train_jobs(params.games, params.rl_text.max_train_tasks, games)
    per_group = max(1, tasks // len(games))
    picked = [j for g in games for j in [j for j in jobs if j[0] is g][:per_group]]
    episodes = [(g, t, s) for g, t in picked for s in range(params.rl_text.trajectories_per_task)]
    dpo = params.data_path("train_policy", "dpo")
    model, tokenizer = load_policy(dpo, params.policy.device)
    policy = PolicyPlayer(params.policy, params.rollout_text.batch_size).backend(dpo, model, tokenizer)
    rows = play_episodes(policy, episodes, sampling_from_config(params.rollout_text),
                         seed=chunk_seed(params.seed, "bench", 0), token_ids=True,
                         max_format_retries=params.rollout_text.max_format_retries)
    rows = [{**r, "turn_rewards": []} for r in rows]
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(rows, schema=GRPO_SCHEMA), out)
    return len(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, help="checkout of a finished smollm2-learn run")
    ap.add_argument("--before", default="HEAD~1", help="the revision to compare with (default HEAD~1)")
    ap.add_argument("--tasks", type=int, default=8, help="train tasks played once, K episodes each")
    ap.add_argument("--val-tasks", type=int, default=24, help="val tasks of the val pass timed")
    ap.add_argument("--eval-tasks", type=int, default=12, help="held-out tasks evaluate-text's DPO policy plays")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    run = args.run.resolve()
    if args.child:
        print(json.dumps(child(run, args.child, args.val_tasks, args.eval_tasks)))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(before), args.before],
                       check=True)
        try:
            rows = Path(tmp) / "rows.parquet"
            print(f"played {play(run, args.tasks, rows)} episodes", flush=True)
            sides = {"before": before, "after": REPO}
            results: dict[str, list[dict]] = {name: [] for name in sides}
            for _ in range(args.repeats):
                for name, code in sides.items():
                    env = {**os.environ, "PYTHONPATH": str(code), "TQDM_DISABLE": "1"}
                    out = subprocess.run([sys.executable, __file__, "--run", str(run), "--child", str(rows),
                                          "--val-tasks", str(args.val_tasks), "--eval-tasks", str(args.eval_tasks)],
                                         env=env, capture_output=True, text=True, cwd=code)
                    if out.returncode:
                        print(out.stderr[-3000:], file=sys.stderr)
                        return out.returncode
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    results[name].append(r)
                    print(f"{name:<6} update {r['update_s']:.1f} s ({r['replies']} replies), val "
                          f"{r['val_s']:.1f} s ({r['val_episodes']} episodes, success {r['val_success']:.3f}), "
                          f"evaluate-text {r['eval_s']:.1f} s ({r['eval_episodes']} episodes, success "
                          f"{r['eval_success']:.3f}), {r['capability']}"
                          + (f"; params left out (unknown to its code): {', '.join(r['dropped'])}"
                             if r.get("dropped") else ""), flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)], check=False)

    def med(name: str, key: str, per: str) -> float:
        return statistics.median(r[key] / r[per] for r in results[name])

    print("| work | before | after | before / after |\n|---|---|---|---|")
    for key, per, unit in (("update_s", "replies", "s per reply"), ("val_s", "val_episodes", "s per episode"),
                           ("eval_s", "eval_episodes", "s per episode")):
        b, a = med("before", key, per), med("after", key, per)
        print(f"| {key[:-2]} ({unit}) | {b:.3f} | {a:.3f} | {b / a:.2f}x |")
    print(f"cores {os.cpu_count()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(default)')}, "
          f"CPU kernels {results['after'][0]['capability']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
