"""evaluate-nethack: trained agents against a random policy on the task they trained on.

Every policy plays the same ``episodes`` seeds (paired comparison), drawn from ``eval_seed`` (so the agents of every
training ``seed`` play the same games), on ``rl_nethack.task`` with ``evaluate_nethack.max_episode_steps`` as the step
cap; none is a game an evaluated agent trained on (:func:`evaluation_seeds`, from the games its training envs
recorded). Reported per policy: mean task return,
in-game score, deepest dungeon level, episode length and success rate (goal tasks), with standard errors. A
trained policy acts on ``parallel_envs`` envs at once (one batched network call per step) and samples its actions
with a seeded torch RNG, so the numbers are reproducible.

Output: ``data/evaluate_nethack`` — chunked Parquet, one row per episode, one part per policy (resumable);
``data/evaluate_nethack_replays`` — every step of each policy's first ``replay_episodes`` episodes with its terminal
frame (``pipeline.nethack.play.REPLAY_STEP_SCHEMA``, recorded as rollout-nethack records its steps), one part per
policy beside the episodes' (the report's replay page draws them); ``metrics/plots/evaluate-nethack.csv`` (means per
policy, for ``dvc plots``) and ``metrics/plots/evaluate-nethack.png``.

    curio stage evaluate-nethack -S evaluate_nethack.episodes=32
"""

from __future__ import annotations

import csv
from functools import partial

import numpy as np
import pyarrow as pa

from pipeline.core.artifacts import chunk_seed, file_sha256, read_manifest, read_table
from pipeline.core.config import ConfigError
from pipeline.core.runners import ChunkJob, run_chunked
from pipeline.core.stage import Out, Plot, Stage, StageContext, StageResult
from pipeline.nethack.env import nethack_core_seed
from pipeline.nethack.play import EPISODE_SCHEMA, REPLAY_STEP_SCHEMA, EnvSpec, StepRecorder, play_policy, play_random
from pipeline.nethack.progression import progression
from pipeline.params import Params

NAME = "evaluate-nethack"


def _needs(params: Params) -> list[str]:
    """The trained agents, when a policy other than the random one is evaluated."""
    return ["data/rl_nethack"] if any(p != "random" for p in params.evaluate_nethack.policies) else []


METRIC_HELP = {
    "{policy}/episodes": "evaluation episodes the agent played (the same seeds for every agent)",
    **{f"{{policy}}/{col}{sem}": f"{'standard error of the ' if sem else ''}mean {what} of its episodes"
       for col, what in {"return": "in-game return", "score": "in-game score", "depth": "deepest dungeon level",
                         "xlvl": "experience level reached", "progression": "BALROG progression (0-100)",
                         "length": "steps", "success": "success (goal tasks)"}.items() for sem in ("", "_sem")},
    "{policy}/score_median": "median in-game score of its episodes (NLE's protocol)",
    "{policy}/score_median_sem": "bootstrap standard error of that median",
    "{policy}/{column}_vs_{baseline}": "mean over seeds of the agent's return, score or progression minus the "
                                        "baseline agent's (random, extrinsic, motif) on the same seed",
    "{policy}/{column}_vs_{baseline}_sem": "standard error of that paired difference",
    "replay_steps": "steps recorded for the report's replay pages",
    "training_games_checked": "games the agents trained on, checked so that no evaluation seed is one of them",
    "seeds_passed_over": "evaluation seeds skipped because training played them",
    "agents_without_seed_record": "agents trained before seed records were kept ('none' when every agent has one)",
}

STAGE = Stage(
    NAME,
    params=["eval_seed", "nethack", "rl_nethack.task", "rl_nethack.extended_actions", "rl_nethack.variants",
            "evaluate_nethack"],
    code=["pipeline/nethack/play.py", "pipeline/nethack/sf.py", "pipeline/nethack/env.py", "pipeline/nethack/clock.py",
          "pipeline/nethack/clock.c"],
    data=["data/rl_nethack"],
    needs=_needs,
    outs=[Out("data/evaluate_nethack", persist=True), Out("data/evaluate_nethack_replays", persist=True)],
    plots=[
        Plot("metrics/plots/evaluate-nethack.csv", "NetHack evaluation, mean return", x="return", y="policy",
             template="bar_horizontal"),
        Plot("metrics/plots/evaluate-nethack.png"),
    ],
    track="nethack",
    metric_help=METRIC_HELP,
)
COLUMNS = ("return", "score", "depth", "xlvl", "progression", "length", "success")
ROW_SCHEMA_VERSION = 2  # 2: the experience level reached (xlvl)


def evaluation_seeds(seed: int, episodes: int, trained: set[int]) -> tuple[list[int], int]:
    """The seeds of the evaluation episodes, and how many candidates were passed over: ``chunk_seed(seed, NAME, i)``
    for i = 0, 1, … skipping any whose NetHack core seed is in ``trained`` (the games training played), so every
    policy is evaluated on games it never trained on."""
    seeds: list[int] = []
    i = 0
    while len(seeds) < episodes:
        candidate = chunk_seed(seed, NAME, i)
        i += 1
        if nethack_core_seed(candidate) not in trained:
            seeds.append(candidate)
    return seeds, i - episodes


def trained_seeds(params: Params, policies: list[str]) -> tuple[set[int], list[str]]:
    """The core seeds of every game the evaluated agents trained on, and the agents with no record of them."""
    from pipeline.nethack.sf import training_seed_cores  # sample-factory: only for trained agents

    trained: set[int] = set()
    unrecorded = []
    for name in policies:
        if name == "random":
            continue
        cores = training_seed_cores(params.data_path("rl_nethack", name))
        if cores is None:
            unrecorded.append(name)
        else:
            trained |= cores
    return trained, unrecorded


def evaluate_policy(params: Params, index: int, name: str, seeds: list[int]) -> tuple[list[dict], pa.Table]:
    """One policy's episode summaries, and the recorded steps of its first ``replay_episodes`` episodes."""
    cfg = params.evaluate_nethack
    replays = min(cfg.replay_episodes, cfg.episodes)
    spec = EnvSpec(params.rl_nethack.task, params.rl_nethack.extended_actions, cfg.max_episode_steps,
                   frames=replays > 0, clock=params.nethack.clock)
    episodes = list(range(cfg.episodes))
    recorder = StepRecorder(frames=True)

    def record(episode: int, *step) -> None:
        if episode < replays:
            recorder.add(episode, *step)

    if name == "random":
        summaries = play_random(spec, episodes, seeds, on_step=record)
    else:
        import torch

        from pipeline.nethack.sf import TrainedPolicy  # sample-factory: only for a trained agent

        torch.manual_seed(chunk_seed(params.eval_seed, NAME, -1 - index))
        policy = TrainedPolicy(params.data_path("rl_nethack", name), deterministic=cfg.deterministic)
        summaries = play_policy(spec, policy, episodes, seeds, parallel_envs=cfg.parallel_envs, on_step=record)
    steps = recorder.table()
    # the steps of one policy are recorded as they come (parallel envs interleave them): episode by episode here
    steps = steps.sort_by([("episode", "ascending"), ("step", "ascending")])
    steps = steps.add_column(0, "policy", pa.array([name] * steps.num_rows, pa.string()))
    return [s.row(name) for s in summaries], steps.cast(REPLAY_STEP_SCHEMA)


PAIRED = ("return", "score", "progression")  # compared seed by seed with the baseline agents
# random and extrinsic (every agent's), and Motif (ONI's claim: online rewards match the offline reward model's)
BASELINES = ("random", "extrinsic", "motif")
BOOTSTRAP = 2000  # resamples behind the median's standard error


def _mean_sem(values: np.ndarray) -> tuple[float, float]:
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0


def _median_sem(values: np.ndarray) -> tuple[float, float]:
    """The median and its bootstrap standard error (seeded: the same rows give the same figure)."""
    if len(values) < 2:
        return float(np.median(values)) if len(values) else 0.0, 0.0
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(values, size=(BOOTSTRAP, len(values)), replace=True), axis=1)
    return float(np.median(values)), float(medians.std(ddof=1))


def with_progression(row: dict) -> dict:
    """The row with BALROG's progression (0-100) of the dungeon and experience levels it reached."""
    return {**row, "progression": progression(int(row["depth"]), int(row["xlvl"]))}


def summarize(rows: list[dict], policies: list[str]) -> dict[str, dict[str, float]]:
    """Mean and standard error per policy and column (NLE's protocol adds the median score, with a bootstrap
    standard error); with ``random``, ``extrinsic`` or ``motif`` among the policies, also each other policy's paired
    difference from them (``return_vs_random``, ``score_vs_extrinsic``, ... and their ``_sem``): the mean over seeds
    of (policy − baseline) on the same seed, whose standard error is what "beats random by k s.e." is measured in."""
    rows = [with_progression(r) for r in rows]
    out = {}
    by_seed = {name: {r["seed"]: r for r in rows if r["policy"] == name} for name in policies}
    for name in policies:
        mine = [r for r in rows if r["policy"] == name]
        stats: dict[str, float] = {"episodes": len(mine)}
        for col in COLUMNS:
            stats[col], stats[f"{col}_sem"] = _mean_sem(np.asarray([float(r[col]) for r in mine]))
        stats["score_median"], stats["score_median_sem"] = _median_sem(np.asarray([float(r["score"]) for r in mine]))
        for base in BASELINES:
            seeds = sorted(by_seed[name].keys() & by_seed.get(base, {}).keys())
            if name == base or not seeds:
                continue
            for col in PAIRED:
                diff = np.asarray([float(by_seed[name][s][col]) - float(by_seed[base][s][col]) for s in seeds])
                stats[f"{col}_vs_{base}"], stats[f"{col}_vs_{base}_sem"] = _mean_sem(diff)
        out[name] = stats
    return out


def markdown_table(summary: dict[str, dict[str, float]]) -> str:
    lines = ["| policy | return | return − random (paired) | score | median score | depth | experience level | "
             "progression (BALROG, 0-100) | length | success |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in summary.items():
        cells = {c: f"{s[c]:.2f} ± {s[c + '_sem']:.2f}" for c in COLUMNS}
        paired = (f"{s['return_vs_random']:+.2f} ± {s['return_vs_random_sem']:.2f}" if "return_vs_random" in s
                  else "—")
        median = f"{s['score_median']:.1f} ± {s['score_median_sem']:.1f}"
        lines.append(f"| {name} | {cells['return']} | {paired} | {cells['score']} | {median} | {cells['depth']} | "
                     f"{cells['xlvl']} | {cells['progression']} | {cells['length']} | {cells['success']} |")
    return "\n".join(lines)


def plot(summary: dict[str, dict[str, float]], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.2))
    for ax, col in zip(axes, ("return", "score", "depth", "length"), strict=True):
        ax.bar(names, [summary[n][col] for n in names], yerr=[summary[n][f"{col}_sem"] for n in names],
               capsize=3, color=["#999999" if n == "random" else "#3b75af" for n in names])
        ax.set_title(col)
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle("NetHack evaluation: mean ± s.e. over the same seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def policy_names(params: Params) -> list[str]:
    """evaluate_nethack.policies with 'all' standing for every rl_nethack variant, each name once."""
    names: list[str] = []
    for name in params.evaluate_nethack.policies:
        names.extend(params.rl_nethack.variants if name == "all" else [name])
    return list(dict.fromkeys(names))


def evaluate_chunk(params: Params, seeds: list[int], _state: None, index: int,
                   policy: str) -> tuple[list[dict], pa.Table]:
    """One chunk of evaluate-nethack: one policy's episodes (and the steps of those it keeps for replay)."""
    return evaluate_policy(params, index, policy, seeds)


def run(params: Params, ctx: StageContext) -> StageResult:
    import torch

    cfg = params.evaluate_nethack
    policies = policy_names(params)
    torch.set_num_threads(1)  # batches of 8 observations: threads only add contention on shared cores
    # 'all' hides which variants were evaluated from the params hash: name them in the upstream instead.
    upstream = {"policies": ",".join(policies)} if "all" in cfg.policies else {}
    for name in policies:
        if name == "random":
            continue
        if name not in params.rl_nethack.variants:
            raise ConfigError(f"params: evaluate_nethack.policies: {name!r} is neither 'random' nor a "
                              "rl_nethack.variants name")
        from pipeline.nethack.sf import latest_checkpoint  # sample-factory, as above

        found = latest_checkpoint(params.data_path("rl_nethack", name))
        if found is None:
            raise FileNotFoundError(f"{params.data_path('rl_nethack', name)}: no checkpoint (run rl-nethack first)")
        upstream[name] = file_sha256(found[0])
    trained, unrecorded = trained_seeds(params, policies)
    if unrecorded:
        print(f"evaluate-nethack: warning: {', '.join(unrecorded)} kept no record of its training seeds (trained "
              "before records were kept): unseen seeds are checked against the other agents' only", flush=True)
    seeds, passed_over = evaluation_seeds(params.eval_seed, cfg.episodes, trained)
    out = params.data_path("evaluate_nethack")
    run_chunked(
        out,
        num_chunks=len(policies),
        make_chunk=ChunkJob(run=partial(evaluate_chunk, params, seeds), inputs=policies),
        params_hash=params.section_hash(STAGE.params),
        upstream=upstream,
        schema=EPISODE_SCHEMA,
        desc="evaluate-nethack policies",
        schema_version=ROW_SCHEMA_VERSION,
        companions=[(params.data_path("evaluate_nethack_replays"), REPLAY_STEP_SCHEMA)],
    )
    summary = summarize(read_table(out).to_pylist(), policies)
    plots = params.plots_path()
    plots.mkdir(parents=True, exist_ok=True)
    with open(plots / f"{NAME}.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["policy", *COLUMNS])
        for name, s in summary.items():
            writer.writerow([name, *(round(s[c], 4) for c in COLUMNS)])
    plot(summary, plots / f"{NAME}.png")
    print(markdown_table(summary), flush=True)
    metrics: dict[str, float | int | str] = {
        f"{name}/{key}": round(value, 4) for name, s in summary.items() for key, value in s.items()
    }
    metrics["replay_steps"] = read_manifest(params.data_path("evaluate_nethack_replays"))["rows"]
    # unseen seeds: training games checked against, and evaluation seeds passed over because training played them
    metrics.update(training_games_checked=len(trained), seeds_passed_over=passed_over,
                   agents_without_seed_record=",".join(unrecorded) or "none")
    return StageResult(metrics=metrics, outputs=[str(out), str(params.data_path("evaluate_nethack_replays")),
                                                 str(plots / f"{NAME}.csv"), str(plots / f"{NAME}.png")])
