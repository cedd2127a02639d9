"""evaluate-text: held-out success rate and mean turns of the base, SFT, DPO and RL policies.

Each policy plays every held-out task × k trajectories (one Parquet part per policy, so a kill loses at most
one policy's evaluation). The groups played are ``games.eval_groups`` (null = ``games.groups``), so a run
that trains on some groups can be evaluated on a held-out one (``curio logo GROUP``). Metrics
``metrics/stages/evaluate-text.json`` (``dvc metrics show``): ``POLICY/success_rate``, ``POLICY/mean_turns``, … and
per group ``POLICY/GROUP/success_rate``, ``POLICY/GROUP/mean_turns``; plot data ``metrics/plots/eval.json``, a bar
chart ``metrics/plots/eval.png`` and, with more than one group, per-group bars ``metrics/plots/eval_groups.png``.
"""

from __future__ import annotations

from functools import partial

from pipeline.core.artifacts import atomic_write_json, chunk_seed, dir_hash, read_rows
from pipeline.core.runners import ChunkJob, run_chunked
from pipeline.core.stage import Out, Plot, Stage, StageContext, StageResult
from pipeline.envs.external import turn_limit_metrics
from pipeline.llm import sampling_from_config
from pipeline.llm.environment import environment_accounting
from pipeline.llm.ledger import metric_help as ledger_help
from pipeline.params import Params
from pipeline.text.play import EPISODE_SCHEMA, pass_at_k, play_episodes, summarize, summary_help
from pipeline.text.policies import eval_groups, game_tasks, load_policy_backend, make_games, policy_deps, policy_path

NAME = "evaluate-text"


def _needs(params: Params) -> list[str]:
    return policy_deps(params.policy, *params.evaluate_text.policies)  # the policies it evaluates


METRIC_HELP = {
    **summary_help("{policy}/", "the policy (base, sft, dpo, rl) on the held-out tasks"),
    "{policy}/pass@{k}": "share of the held-out tasks with at least one win among k of their episodes (unbiased "
                         "estimator; with evaluate_text.trajectories_per_task >= k)",
    "{policy}/{group}/success_rate": "share of the group's held-out episodes the policy won",
    "{policy}/{group}/mean_turns": "mean turns of the group's held-out episodes the policy won",
    **ledger_help("environment/", "the LLM environment (a game an LLM hosts)"),
    "{policy}/{group}/turn_limit": "share of an external group's held-out episodes (textarena:, openenv:) that Curio's "
                                   "turn limit ended, the environment had not",
}

STAGE = Stage(
    NAME,
    params=[
        "eval_seed", "policy", "games", "rollout_text.top_p", "rollout_text.min_p", "rollout_text.max_new_tokens",
        "rollout_text.max_format_retries", "rollout_text.batch_size", "rollout_text.environment", "evaluate_text",
    ],
    code=["pipeline/text/play.py", "pipeline/text/policies.py", "pipeline/text/critic.py", "pipeline/envs"],
    data=["data/bootstrap", "data/train_policy/sft", "data/train_policy/dpo", "data/rl_text"],
    needs=_needs,
    outs=[Out("data/evaluate_text", persist=True)],
    plots=[
        Plot("metrics/plots/eval.json", "Text evaluation, held-out success", x="success_rate", y="policy",
             template="bar_horizontal"),
        Plot("metrics/plots/eval.png"),
    ],
    notes={"pipeline/text/critic.py": "a chai model is the policy re-ranked by its critic",
           "pipeline/envs": "the games it plays"},
    metric_help=METRIC_HELP,
)


PASS_K = 4  # pass@4 (and mean@4: the success rate), as multi-turn agent papers report them


def evaluate_policy(params: Params, policy: str, split: str, seed: int, k: int, temperature: float,
                    groups: list[str] | None = None) -> list[dict]:
    """Play every task of ``split`` in ``groups`` (default: the evaluation groups) k times with the named
    policy; episode rows."""
    groups = eval_groups(params.games) if groups is None else groups
    backend = load_policy_backend(params, policy, groups=groups)
    games = make_games(params, groups)
    jobs = [(g, t, s) for g in games for t in game_tasks(params.games, g, split) for s in range(k)]
    sampling = sampling_from_config(params.rollout_text, temperature=temperature)
    try:
        return play_episodes(backend, jobs, sampling, seed=seed,
                             max_format_retries=params.rollout_text.max_format_retries, policy_name=policy)
    finally:
        backend.close()  # a vllm policy's server stops before the next policy's starts


def evaluate_chunk(params: Params, _state: None, _index: int, policy: str) -> list[dict]:
    """One chunk of evaluate-text: one policy's episodes (the same seed for every policy, and for every training
    seed: ``eval_seed``)."""
    cfg = params.evaluate_text
    return evaluate_policy(params, policy, "eval", chunk_seed(params.eval_seed, NAME, 0), cfg.trajectories_per_task,
                           cfg.temperature)


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


def group_summaries(rows: list[dict], policies: list[str], groups: list[str]) -> dict[str, dict[str, dict]]:
    """policy -> group -> summarize() of that policy's episodes in that group."""
    return {p: {g: summarize([r for r in rows if r["policy"] == p and r["group"] == g]) for g in groups}
            for p in policies}


def plot_group_bars(per_group: dict[str, dict[str, dict]], path) -> None:
    """Grouped bars: success rate and mean turns per task group, one bar per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(per_group)
    groups = list(next(iter(per_group.values())))
    width = 0.8 / len(policies)
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(groups) * 2), 3.6))
    for j, p in enumerate(policies):
        xs = [i + (j - (len(policies) - 1) / 2) * width for i in range(len(groups))]
        axes[0].bar(xs, [per_group[p][g]["success_rate"] for g in groups], width, label=p)
        axes[1].bar(xs, [per_group[p][g]["mean_turns"] for g in groups], width, label=p)
    axes[0].set_ylabel("held-out success rate")
    axes[0].set_ylim(0, 1)
    axes[1].set_ylabel("mean turns (successes)")
    for ax in axes:
        ax.set_xticks(range(len(groups)), groups, rotation=20, ha="right")
        ax.grid(axis="y", alpha=0.3)
    axes[1].legend(fontsize=8, title="policy", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.evaluate_text
    out = params.data_path("evaluate_text")
    policies = list(cfg.policies)
    upstream = {p: dir_hash(policy_path(params, p)) for p in policies}
    with environment_accounting() as environment:  # one LLM-environment ledger over every policy's games
        run_chunked(
            out, num_chunks=len(policies), make_chunk=ChunkJob(run=partial(evaluate_chunk, params), inputs=policies),
            params_hash=params.section_hash(STAGE.params), upstream=upstream, schema=EPISODE_SCHEMA, desc="policies",
        )
    rows = read_rows(out)
    groups = eval_groups(params.games)
    results = {p: summarize([r for r in rows if r["policy"] == p]) for p in policies}
    per_group = group_summaries(rows, policies, groups)
    plots = params.plots_path()
    atomic_write_json(plots / "eval.json", [{"policy": p, "success_rate": results[p]["success_rate"],
                                            "mean_turns": results[p]["mean_turns"]} for p in policies])
    plot_bars(results, plots / "eval.png")
    ctx.tracker.log_artifact(plots / "eval.png")
    group_png = plots / "eval_groups.png"
    if len(groups) > 1:
        plot_group_bars(per_group, group_png)
        ctx.tracker.log_artifact(group_png)
    else:
        group_png.unlink(missing_ok=True)  # a single group: eval.png says it all; no stale multi-group plot
    metrics = {f"{p}/{k}": v for p, res in results.items() for k, v in res.items()}
    for p in policies:  # the field's pass@k beside the success rate (= mean@k), where k episodes per task were played
        passed = pass_at_k([r for r in rows if r["policy"] == p], PASS_K)
        if passed is not None:
            metrics[f"{p}/pass@{PASS_K}"] = passed
    for p in policies:
        for g in groups:
            metrics[f"{p}/{g}/success_rate"] = per_group[p][g]["success_rate"]
            metrics[f"{p}/{g}/mean_turns"] = per_group[p][g]["mean_turns"]
    metrics.update(environment.metrics())  # environment/... when an LLM answered as the environment
    for p in policies:  # episodes of other projects' environments that Curio's turn limit ended, not the game
        metrics.update(turn_limit_metrics([r for r in rows if r["policy"] == p], f"{p}/"))
    return StageResult(metrics=metrics, outputs=[str(out)])
