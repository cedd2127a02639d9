"""rl-nethack: APPO (sample-factory 2.x) on an NLE task, one agent per reward variant.

Each variant of ``rl_nethack.variants`` trains with r = ext_coef·r_ext + int_coef·1[r̃ > ε]·r̃ / N_ep(m)^β, where r̃
is the normalised output of the train-reward model for the step's message (``pipeline.nethack.intrinsic``);
the default trains Motif (ext + int), an extrinsic-only and an intrinsic-only agent. A variant whose ``reward`` is
retrieval / classification / ranking / cosine uses ONI's online reward instead (``pipeline.nethack.oni``): an
annotator process labels messages while it trains; its progress over env steps goes to MLflow and to
``metrics/plots/rl-nethack-oni/<variant>.csv``. presets/oni.yaml sets up ONI's comparison. Training runs
``python -m pipeline.nethack`` (sample-factory with Curio's env and encoder registered) in a child process.

Resume is sample-factory's own: the experiment directory keeps checkpoints (every 30 s and at the end) and a
rerun continues from the latest one until ``train_for_env_steps``; a finished variant is skipped. On SIGTERM each
training process is asked to stop: it ends its training iteration through sample-factory's own end of training,
which saves a checkpoint (``pipeline.nethack.sf``), and the stage stops saying where each variant resumes. When anything
else about a variant changes (its coefficients, the task, the reward model …) its directory is cleared and it
starts over, so a checkpoint never continues under different rewards.

Output: ``data/rl_nethack/<variant>/`` (sample-factory experiment: config.json, checkpoint_p0/, logs,
``curio_summary.json``).

    curio stage rl-nethack -S rl_nethack.train_for_env_steps=200000
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pipeline.core import interrupt
from pipeline.core.artifacts import atomic_write_json, dir_hash, stable_hash
from pipeline.core.checkpoints import keyed_dir, run_key
from pipeline.core.errors import TimedOut
from pipeline.core.stage import Out, Plot, Stage, StageContext, StageResult
from pipeline.nethack.config import RLNetHackVariant
from pipeline.nethack.oni import ONLINE_REWARDS, PROGRESS
from pipeline.nethack.sf import CURVE, PROGRESS_COLUMNS, SUMMARY, latest_checkpoint
from pipeline.nethack.sf_process import GRACE_ENV, STOPPED_EXIT
from pipeline.params import Params

NAME = "rl-nethack"


def _needs(params: Params) -> list[str]:
    """The reward model, when a variant's intrinsic reward is Motif's."""
    motif = any(v.reward == "motif" and v.int_coef != 0 for v in params.rl_nethack.variants.values())
    return ["data/reward_model"] if motif else []


METRIC_HELP = {
    "{variant}/env_steps": "environment steps the variant's agent has trained for",
    "{variant}/fps": "environment steps per second of its training",
    "{variant}/resumed_from_env_steps": "the env step its training resumed from (0: it started afresh)",
    "{variant}/train_true_objective": "mean in-game return of its last training episodes",
    "{variant}/train_len": "mean steps of its last training episodes",
    "{variant}/train_score": "mean in-game score of its last training episodes",
    "{variant}/train_depth": "mean deepest dungeon level of its last training episodes",
    "{variant}/train_intrinsic_return": "mean intrinsic (LLM-derived) return of its last training episodes",
    "{variant}/train_extrinsic_return": "mean extrinsic (game) return of its last training episodes",
    "{variant}/oni_{stat}": "ONI variants: the online annotator's last progress row (labels, pending, helpful_share, "
                           "labels_per_s, heldout_accuracy, errors, annotator_restarts, llm_sent, llm_failures, "
                           "llm_unknowns, cpu_s and its parts cpu_label_s, cpu_fit_s, cpu_publish_s, seconds)",
}

STAGE = Stage(
    NAME,
    params=["seed", "nethack", "rl_nethack"],
    code=[
        "pipeline/nethack/sf.py", "pipeline/nethack/sf_process.py", "pipeline/nethack/intrinsic.py",
        "pipeline/nethack/oni.py",
        "pipeline/llm/online_annotation.py",
        "pipeline/nethack/env.py", "pipeline/nethack/reward.py", "pipeline/nethack/clock.py",
        "pipeline/nethack/clock.c",
    ],
    data=["data/reward_model"],
    needs=_needs,
    outs=[Out("data/rl_nethack", persist=True)],
    plots=[
        Plot("metrics/plots/rl-nethack.json", "NetHack APPO, episode return over env steps", x="env_steps", y="return",
             template="variants"),
        Plot("metrics/plots/rl-nethack-oni", x="env_steps", y="pending", in_stage=True,
             note="one CSV per online variant; other columns: dvc plots show -y labels ..."),
    ],
    models=["rl_nethack"],
    track="nethack",
    metric_help=METRIC_HELP,
)


def sf_args(params: Params, name: str, variant: RLNetHackVariant, train_dir: Path, reward_dir: Path) -> list[str]:
    """The sample-factory command line of one variant (without --train_for_env_steps)."""
    cfg = params.rl_nethack
    uses_model = variant.reward == "motif" and variant.int_coef != 0
    threshold = "none" if cfg.threshold_quantile is None else str(cfg.threshold_quantile)
    args = {
        "experiment": name,
        "train_dir": str(train_dir),
        "seed": params.seed,
        "nethack_task": cfg.task,
        "nethack_extended_actions": cfg.extended_actions,
        "nethack_max_episode_steps": cfg.max_episode_steps,
        "nethack_clock": params.nethack.clock,
        "reward_model_dir": str(reward_dir) if uses_model else "",
        "ext_coef": variant.ext_coef,
        "int_coef": variant.int_coef,
        "count_exponent": cfg.count_exponent,
        "threshold_quantile": threshold,
        "reward_scale": cfg.reward_scale,
        "learning_rate": cfg.learning_rate,
        "gamma": cfg.gamma,
        "serial_mode": cfg.serial_mode,
        "num_workers": cfg.num_workers,
        "num_envs_per_worker": cfg.num_envs_per_worker,
        # Double-buffered sampling pays off with parallel workers; one serial worker is faster without it.
        "worker_num_splits": 1 if cfg.serial_mode else 2,
        "batch_size": cfg.batch_size,
        "rollout": cfg.rollout,
        "use_rnn": cfg.use_rnn,
        "intrinsic_reward": variant.reward if variant.int_coef != 0 else "none",
    }
    if cfg.deterministic:
        # One process, sampling and learning in turn: the order of everything is fixed by the seed, not by timing.
        args.update(serial_mode=True, async_rl=False, num_workers=1, worker_num_splits=1, nethack_deterministic=True)
    if variant.reward in ONLINE_REWARDS and variant.int_coef != 0:
        oni = cfg.oni.model_dump(mode="json")
        args["oni_refresh_s"] = oni.pop("refresh_s")
        args["oni_config"] = json.dumps(oni, sort_keys=True, separators=(",", ":"))
    return [f"--{k}={v}" for k, v in args.items()] + list(cfg.extra_args)


def identity(args: list[str], reward_dir: Path, uses_model: bool) -> str:
    """The run key of a variant's checkpoints: the arguments except where things live (its params slice), and
    the reward model's content (not its path), so moving the data directory does not restart training."""
    where = ("--experiment=", "--train_dir=", "--reward_model_dir=")
    kept = [a for a in args if not a.startswith(where)]
    return run_key(stable_hash(kept), dir_hash(reward_dir) if uses_model else "")


_SPAWN = threading.Lock()  # one fork at a time


def _stop_with_parent() -> None:
    """In the training child: get SIGINT when this stage's process dies, however it dies (even SIGKILL).

    sample-factory stops cleanly on SIGINT and writes a checkpoint, so a killed stage leaves no orphan
    training on and the rerun resumes from where it stopped. (The signal follows the thread that started the
    child, which waits for it to the end.)
    """
    interrupt.signal_on_parent_death(signal.SIGINT)


def _trained(experiment: Path, checkpoint: tuple[Path, int] | None, budget: int) -> bool:
    """The variant has its budget of env steps checkpointed and its summary written."""
    return checkpoint is not None and checkpoint[1] >= budget and (experiment / SUMMARY).exists()


def train_variant(params: Params, name: str, variant: RLNetHackVariant, log: Path | None = None) -> dict:
    """Train (or resume, or skip) one variant; returns its curio_summary.json plus what was done."""
    cfg = params.rl_nethack
    train_dir = params.data_path("rl_nethack")
    reward_dir = params.data_path("reward_model")
    experiment = train_dir / name
    args = sf_args(params, name, variant, train_dir, reward_dir)
    ident = identity(args, reward_dir, variant.reward == "motif" and variant.int_coef != 0)
    keyed_dir(experiment, ident)  # sample-factory resumes in it; trained under other settings: emptied first

    found = latest_checkpoint(experiment)
    if _trained(experiment, found, cfg.train_for_env_steps):
        return {**json.loads((experiment / SUMMARY).read_text()), "action": "skipped (already trained)"}
    if interrupt.requested() is not None:  # asked to stop before this variant started
        return {"action": "stopped", "env_steps": found[1] if found else 0}
    command = [sys.executable, "-m", "pipeline.nethack", *args, f"--train_for_env_steps={cfg.train_for_env_steps}"]
    log = log or experiment / "curio_train.log"
    # The child must import this checkout's pipeline package whether or not it is installed.
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    grace = interrupt.grace_period()
    if grace is not None:  # a stopped trainer exits by half of it, so the stage ends within its own
        env[GRACE_ENV] = f"{grace / 2:g}"
    (experiment / SUMMARY).unlink(missing_ok=True)  # written anew by this run's end, or it failed
    start = time.time()
    with open(log, "a") as out:
        with _SPAWN:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    preexec_fn=_stop_with_parent)
    # SIGTERM: sample-factory ends its training iteration and saves a checkpoint (pipeline.nethack.sf)
    with proc, interrupt.on_stop(lambda signum: proc.send_signal(signal.SIGTERM)):
        try:
            code = proc.wait(timeout=cfg.timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # stop cleanly: sample-factory writes a checkpoint to resume from
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
            saved = latest_checkpoint(experiment)
            raise TimedOut(
                f"rl-nethack: {name} did not finish within rl_nethack.timeout_s = {cfg.timeout_s} s (its checkpoint "
                f"at {saved[1] if saved else 0} env steps is kept; log {log}): resume with `dvc repro` or `curio "
                "stage rl-nethack` and the same params (`dvc exp run` first restores the baseline's outputs)"
            ) from None
    saved = latest_checkpoint(experiment)
    # a stop that came after its last iteration leaves it trained, as the rerun would find it (and skip it)
    if not (code in (0, STOPPED_EXIT) and _trained(experiment, saved, cfg.train_for_env_steps)):
        if code == STOPPED_EXIT or interrupt.requested() is not None:
            return {"action": "stopped", "env_steps": saved[1] if saved else 0}
        if code != 0 or not (experiment / SUMMARY).exists():
            raise RuntimeError(f"rl-nethack: training {name} failed (exit {code}); see {log}")
    summary = json.loads((experiment / SUMMARY).read_text())
    action = "resumed" if found is not None else "trained"
    return {**summary, "action": action, "wall_seconds": round(time.time() - start, 1)}


def oni_progress(params: Params, name: str) -> list[dict[str, float]]:
    """The annotator's status over env steps of one online variant (``oni/progress.csv``), as numbers."""
    path = params.data_path("rl_nethack", name, "oni", PROGRESS)
    if not path.exists():
        return []
    with open(path, newline="") as f:
        rows = [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]
    return [{**row, "env_steps": int(row["env_steps"])} for row in rows]


def report_oni(params: Params, ctx: StageContext) -> dict[str, float | int | str]:
    """ONI's annotation over env steps: to MLflow (step = env steps), to the dvc plots (one CSV per online
    variant in ``metrics/plots/rl-nethack-oni/``) and the last values as metrics."""
    plots = params.plots_path("rl-nethack-oni")
    if plots.exists():
        shutil.rmtree(plots)  # variants no longer configured leave no stale curve
    plots.mkdir(parents=True)
    metrics: dict[str, float | int | str] = {}
    for name, variant in params.rl_nethack.variants.items():
        if variant.reward not in ONLINE_REWARDS or variant.int_coef == 0:
            continue
        rows = oni_progress(params, name)
        with open(plots / f"{name}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(PROGRESS_COLUMNS), extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        for row in rows:
            ctx.tracker.log_metrics({f"{name}/oni_{k}": v for k, v in row.items() if k != "env_steps"},
                                    step=int(row["env_steps"]))
        if rows:
            metrics.update({f"{name}/oni_{k}": v for k, v in rows[-1].items()
                            if k in {"labels", "pending", "helpful_share", "labels_per_s", "heldout_accuracy",
                                     "errors", "annotator_restarts", "llm_sent", "llm_failures", "llm_unknowns",
                                     "cpu_s", "cpu_label_s", "cpu_fit_s", "cpu_publish_s", "seconds"}})
    if not any(plots.iterdir()):  # `dvc plots show` warns about an empty plots directory; a header reads as no data
        (plots / "none.csv").write_text(",".join(PROGRESS_COLUMNS) + "\n")
    return metrics


def concurrent_variants(params: Params, cores: int | None = None) -> int:
    """How many variants train at once: each is its own sample-factory process on one torch thread, so one
    core per variant (serial mode; a parallel runner's workers take a core each), up to twice the cores — time
    slicing costs little, and the last variant does not train alone while the other cores sit idle."""
    cfg = params.rl_nethack
    cores = cores or len(os.sched_getaffinity(0))
    per_variant = 1 if cfg.serial_mode or cfg.deterministic else cfg.num_workers + 1
    return max(1, min(len(cfg.variants), 2 * cores // per_variant))


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.rl_nethack
    metrics: dict[str, float | int | str] = {}
    for name, variant in cfg.variants.items():
        if variant.reward == "motif" and variant.int_coef != 0 and not params.data_path("reward_model").exists():
            raise FileNotFoundError(f"{params.data_path('reward_model')}: variant {name} needs the train-reward "
                                    "model (run train-reward first)")
    # Variants are independent processes with their own seeds: trained side by side, each learns what it would
    # alone (one torch thread each; nothing depends on wall time but when checkpoints are written).
    with ThreadPoolExecutor(max_workers=concurrent_variants(params)) as pool:
        futures = {name: pool.submit(train_variant, params, name, variant) for name, variant in cfg.variants.items()}
        summaries = {name: f.result() for name, f in futures.items()}
    stopped = [f"{name} at {s['env_steps']} of {cfg.train_for_env_steps} env steps"
               for name, s in summaries.items() if s["action"] == "stopped"]
    if stopped:  # each variant saved its checkpoint
        with interrupt.at(", ".join(stopped)):
            raise interrupt.stopped()
    for name, summary in summaries.items():
        print(f"rl-nethack: {name}: {summary['action']} to {summary['env_steps']} env steps", flush=True)
        stats = summary.get("episode_stats", {})
        metrics.update({
            f"{name}/env_steps": summary["env_steps"],
            f"{name}/fps": summary["fps"],
            f"{name}/resumed_from_env_steps": summary["resumed_from_env_steps"],
            **{f"{name}/train_{k}": round(v, 4) for k, v in stats.items()
               if k in {"true_objective", "len", "score", "depth", "intrinsic_return", "extrinsic_return"}},
        })
    metrics.update(report_oni(params, ctx))
    curve = [{"variant": name, **point} for name in cfg.variants
             if (f := params.data_path("rl_nethack", name, CURVE)).exists() for point in json.loads(f.read_text())]
    atomic_write_json(params.plots_path("rl-nethack.json"), curve)  # episode return over env steps, per variant
    return StageResult(metrics=metrics, outputs=[str(params.data_path("rl_nethack")),
                                                 str(params.plots_path("rl-nethack-oni"))])
