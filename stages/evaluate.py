"""evaluate-text: held-out success rate and mean turns of the base, SFT, DPO and RL policies.

Each policy plays every held-out task × k trajectories (one Parquet part per policy, so a kill loses at most
one policy's evaluation). Metrics ``data/metrics/evaluate-text.json`` (``dvc metrics show``), plot data
``data/plots/eval.json`` and a bar chart ``data/plots/eval.png``.
"""

from __future__ import annotations

from pipeline.artifacts import atomic_write_json, chunk_seed, dir_hash, read_rows, run_chunked
from pipeline.config import Params
from pipeline.llm.base import Sampling
from pipeline.play import EPISODE_SCHEMA, play_episodes, summarize
from pipeline.policies import game_tasks, load_policy_backend, make_games, policy_path
from pipeline.stage import StageContext, StageResult

NAME = "evaluate-text"
PARAMS = ["seed", "policy", "games", "rollout_text.max_new_tokens", "rollout_text.max_format_retries",
          "rollout_text.environment", "evaluate_text"]


def evaluate_policy(params: Params, policy: str, split: str, seed: int, k: int, temperature: float) -> list[dict]:
    """Play every task of ``split`` k times with the named policy; episode rows."""
    backend = load_policy_backend(params, policy)
    jobs = [(g, t, s) for g in make_games(params) for t in game_tasks(params, g, split) for s in range(k)]
    sampling = Sampling(temperature=temperature, top_p=params.rollout_text.top_p,
                        min_p=params.rollout_text.min_p, max_tokens=params.rollout_text.max_new_tokens)
    return play_episodes(backend, jobs, sampling, seed=seed,
                         max_format_retries=params.rollout_text.max_format_retries, policy_name=policy)


def plot_bars(results: dict[str, dict], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    axes[0].bar(names, [results[n]["success_rate"] for n in names], color="#4c72b0")
    axes[0].set_ylabel("held-out success rate")
    axes[0].set_ylim(0, 1)
    axes[1].bar(names, [results[n]["mean_turns"] for n in names], color="#dd8452")
    axes[1].set_ylabel("mean turns (successes)")
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.evaluate_text
    out = params.data_path("evaluate_text")
    policies = list(cfg.policies)
    upstream = {p: dir_hash(policy_path(params, p)) for p in policies}
    run_chunked(
        out, num_chunks=len(policies),
        make_chunk=lambda i: evaluate_policy(params, policies[i], "eval", chunk_seed(params.seed, NAME, 0),
                                             cfg.trajectories_per_task, cfg.temperature),
        params_hash=params.section_hash(PARAMS), upstream=upstream, schema=EPISODE_SCHEMA, desc="policies",
    )
    rows = read_rows(out)
    results = {p: summarize([r for r in rows if r["policy"] == p]) for p in policies}
    for p in policies:
        for g in params.games.groups:
            results[p][g] = summarize([r for r in rows if r["policy"] == p and r["group"] == g])["success_rate"]
    plots = params.data_path("plots")
    atomic_write_json(plots / "eval.json", [{"policy": p, "success_rate": results[p]["success_rate"],
                                            "mean_turns": results[p]["mean_turns"]} for p in policies])
    plot_bars(results, plots / "eval.png")
    ctx.tracker.log_artifact(plots / "eval.png")
    metrics = {f"{p}/{k}": v for p, res in results.items() for k, v in res.items()}
    return StageResult(metrics=metrics, outputs=[str(out)])
