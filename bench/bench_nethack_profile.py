"""Where a NetHack agent's time goes, on one core and in one run: the env, the policy's inference, the learner, the
intrinsic reward and the whole APPO agent, each as a rate per CPU second and per wall second.

    python bench/bench_nethack_profile.py [--preset presets/nethack-oni-seeds.yaml] [--variant extrinsic]
                                          [--seconds 6] [--steps 65536] [--cpu N] [--agent-only | --split]
                                          [-S rl_nethack.num_envs_per_worker=64 ...]

The process is pinned to one core (``--cpu``, default the last one it may use) with one torch thread, and each part
runs with the preset's settings (task, action set, envs per worker, rollout, batch). What each line measures:

- **NLE, random actions**: ``env.step`` of the bare task env (the one every part below wraps), seeded games, uniform
  random actions; the limit.
- **the agent's env**: the env sample-factory builds (``pipeline.nethack.sf.make_nethack_env``: seeded games, the
  reward wrapper with no intrinsic reward, the policy's view), random actions; one env, then ``num_envs_per_worker``
  envs stepped in turn, as a rollout worker steps them (each game's state is its own memory: more envs, more cache
  misses).
- **inference**: the policy's forward pass (action sampling included) on batches of ``num_envs_per_worker``
  observations.
- **rollout + inference**: ``num_envs_per_worker`` agent envs stepped in lockstep, each step's actions from one
  batched forward pass: a rollout worker's work without sample-factory's bookkeeping.
- **intrinsic reward, per step**: the reward object the env wrapper calls once per step
  (``EpisodicIntrinsicReward``) over a recorded stream of messages: Motif's (the reward model's table, a dict lookup;
  a message not in the table is scored by the model once), and ONI classification's (``OnlineRewards``: the worker's
  spool and the published table). ONI's labeller runs in its own process:
  ``bench/bench_nethack_labeller.py`` measures its CPU per label.
- **full APPO agent**: sample-factory's runner in this process with the command line rl-nethack gives
  ``--variant`` (``stages.rl_nethack.sf_args``), for ``--steps`` env steps from a fresh experiment. Its own profile
  (``sample_factory.utils.timing``, here on the process's CPU clock) splits the run into the rollout worker's env
  steps, the inference worker, the learner (whose samples/s is the learner line) and the rest.

Last (``--split`` prints only these): a step of the agent's env (``num_envs_per_worker`` of them stepped in turn)
split by whose code runs (NetHack's C, NLE's Python, Curio's wrappers and view, gymnasium, numpy and other
built-ins), and the policy's arithmetic alone: its forward pass on ``num_envs_per_worker`` observations, and a
forward and backward pass on a batch of ``batch_size`` (the learner's work per sample without sample-factory's loss
and loop), with the model's multiply-adds per sample counted from its layers.

The per-CPU-second rates are the ones to compare across runs on a shared machine: a part's wall rate falls when other
processes take the core, its CPU rate much less.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                flags = Path("/proc/cpuinfo").read_text()
                isa = "AVX-512" if " avx512f" in flags else "AVX2" if " avx2" in flags else "no AVX2"
                return f"{name} ({isa})"
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def fail(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr)
    sys.exit(2)


def measure(work: Callable[[], int], seconds: float) -> tuple[int, float, float]:
    """Call ``work`` (returns units done) until ``seconds`` of CPU time have passed: (units, CPU s, wall s)."""
    units, cpu0, wall0 = 0, time.process_time(), time.perf_counter()
    while time.process_time() - cpu0 < seconds:
        units += work()
    return units, time.process_time() - cpu0, time.perf_counter() - wall0


ROWS_HEADER = f"{'part':<44} {'per CPU s':>12} {'per wall s':>12} {'CPU us':>10}"


def row(name: str, units: float, cpu: float, wall: float, unit: str = "steps/s") -> dict:
    out = {"part": name, "units": int(units), "per_cpu_s": units / cpu, "per_wall_s": units / wall,
           "us_per_unit_cpu": 1e6 * cpu / max(units, 1), "unit": unit}
    print(f"{name:<44} {out['per_cpu_s']:>12,.0f} {out['per_wall_s']:>12,.0f} {out['us_per_unit_cpu']:>10.1f}  {unit}",
          flush=True)
    return out


# -- the parts --------------------------------------------------------------------------------------------------
def nle_random(cfg, seconds: float) -> dict:
    from pipeline.nethack.env import make_env, seed_env

    env = make_env(cfg.nethack_task, extended_actions=cfg.nethack_extended_actions,
                   max_episode_steps=cfg.nethack_max_episode_steps, clock=cfg.nethack_clock)
    rng = np.random.default_rng(0)
    state = {"game": 0}

    def play() -> int:  # one game
        seed_env(env, state["game"])
        state["game"] += 1
        env.reset()
        actions = rng.integers(env.action_space.n, size=cfg.nethack_max_episode_steps)
        for t, a in enumerate(actions.tolist(), 1):
            _, _, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                return t
        return len(actions)

    play()  # warm-up: NLE's first game loads its data files
    out = row("NLE, random actions", *measure(play, seconds))
    env.close()
    return out


def agent_envs(cfg, n: int) -> list:
    from pipeline.nethack.sf import ENV_NAME, make_nethack_env

    return [make_nethack_env(ENV_NAME, cfg, {"env_id": i}) for i in range(n)]


def step_in_turn(envs: list, rng: np.random.Generator) -> int:
    """One random action in each env, in turn, a finished game reset (as a rollout worker steps its envs)."""
    for env, a in zip(envs, rng.integers(envs[0].action_space.n, size=len(envs)).tolist(), strict=True):
        _, _, terminated, truncated, _ = env.step(a)
        if terminated or truncated:
            env.reset()
    return len(envs)


def agent_env(cfg, seconds: float) -> list[dict]:
    """One agent env, then ``num_envs_per_worker`` of them stepped in turn (as a rollout worker steps them)."""
    rows = []
    for n in (1, cfg.num_envs_per_worker):
        envs = agent_envs(cfg, n)
        rng = np.random.default_rng(0)
        for env in envs:
            env.reset()

        def steps(envs=envs, rng=rng) -> int:
            return sum(step_in_turn(envs, rng) for _ in range(16))

        steps()
        name = "the agent's env (wrappers, no intrinsic)" if n == 1 else f"  {n} of them stepped in turn"
        rows.append(row(name, *measure(steps, seconds)))
        for env in envs:
            env.close()
    return rows


def env_split(cfg, seconds: float) -> list[dict]:
    """Whose code a step of the agent's env runs: ``num_envs_per_worker`` agent envs stepped in turn with random
    actions, first plain (the CPU µs a step), then under cProfile, whose own-time per function is summed by owner.
    The profiler slows Python calls several times and NetHack's C step hardly at all, so the C step's share is taken
    from the profile's seconds against the plain run's, and the Python's µs are split in the profile's proportions."""
    import cProfile
    import pstats

    envs = agent_envs(cfg, cfg.num_envs_per_worker)
    rng = np.random.default_rng(0)
    for env in envs:
        env.reset()

    n, cpu, _ = measure(lambda: step_in_turn(envs, rng), seconds)
    profile = cProfile.Profile()
    profile.enable()
    n_profiled = sum(step_in_turn(envs, rng) for _ in range(n // len(envs)))
    profile.disable()
    owners = {"NetHack's C step and reset": 0.0, "NLE's Python": 0.0, "Curio's wrappers and view": 0.0,
              "gymnasium's wrappers": 0.0, "numpy and other built-ins": 0.0}
    for (path, _, func), (_, _, own, _, _) in pstats.Stats(profile).stats.items():
        if "nle._pynethack" in func:
            owner = "NetHack's C step and reset"
        elif "/nle/" in path:
            owner = "NLE's Python"
        elif path.startswith(str(ROOT / "pipeline")):
            owner = "Curio's wrappers and view"
        elif "/gymnasium/" in path:
            owner = "gymnasium's wrappers"
        else:
            owner = "numpy and other built-ins"
        owners[owner] += own
    us_step = cpu / n * 1e6
    c_us = min(owners.pop("NetHack's C step and reset") / n_profiled * 1e6, us_step)
    python = sum(owners.values()) or 1.0
    print(f"the agent's env, {len(envs)} stepped in turn: {us_step:.0f} CPU us a step, of which")
    out = [{"part": "NetHack's C step and reset", "cpu_us": c_us}]
    out += [{"part": k, "cpu_us": (us_step - c_us) * v / python} for k, v in owners.items()]
    for r in out:
        print(f"  {r['part']:<42} {r['cpu_us']:>6.0f} us  {100 * r['cpu_us'] / us_step:>4.0f} %")
    for env in envs:
        env.close()
    return out


def multiply_adds(model, sample: dict) -> int:
    """Multiply-adds of one sample's forward pass through the model's convolutions and linear layers."""
    import torch

    total = 0

    def count(module, inputs, output) -> None:
        nonlocal total
        if isinstance(module, torch.nn.Conv2d):
            total += output[0].numel() * module.in_channels * module.kernel_size[0] * module.kernel_size[1]
        elif isinstance(module, torch.nn.Linear):
            total += module.in_features * module.out_features

    hooks = [m.register_forward_hook(count) for m in model.modules()
             if isinstance(m, torch.nn.Conv2d | torch.nn.Linear)]
    with torch.no_grad():
        model(sample, torch.zeros(1, 0))
    for h in hooks:
        h.remove()
    return total


def model_arithmetic(cfg, seconds: float) -> list[dict]:
    """The policy's forward pass on a rollout worker's batch, and forward + backward on a learner's batch, as CPU µs
    per sample and the GFLOP/s they imply (two FLOPs a multiply-add; backward counted as twice the forward)."""
    import torch

    env = agent_envs(cfg, 1)[0]
    model = policy(cfg, env)
    obs = env.reset()[0]
    env.close()
    macs = multiply_adds(model, observation_batch(model, [obs]))
    small, large = (observation_batch(model, [obs] * n) for n in (cfg.num_envs_per_worker, cfg.batch_size))

    @torch.no_grad()
    def forward() -> int:
        model(small, torch.zeros(cfg.num_envs_per_worker, 0))
        return cfg.num_envs_per_worker

    def learn() -> int:
        out = model(large, torch.zeros(cfg.batch_size, 0))
        (out["action_logits"].logsumexp(-1).mean() + out["values"].mean()).backward()
        return cfg.batch_size

    print(f"the policy: {macs / 1e6:.2f} M multiply-adds a sample's forward pass")
    rows = []
    for name, work, flops in ((f"forward, batch {cfg.num_envs_per_worker}", forward, 2 * macs),
                              (f"forward + backward, batch {cfg.batch_size}", learn, 6 * macs)):
        work()
        n, cpu, _ = measure(work, seconds)
        us = cpu / n * 1e6
        print(f"  {name:<40} {us:>6.0f} us a sample  {flops / us / 1e3:>5.1f} GFLOP/s")
        rows.append({"part": name, "cpu_us": us, "gflops": flops / us / 1e3, "macs": macs})
    return rows


def observation_batch(model, observations: list[dict]) -> dict:
    """The policy's input for a list of the agent env's observations, as sample-factory's workers prepare it."""
    import torch
    from sample_factory.algo.utils.rl_utils import prepare_and_normalize_obs

    return prepare_and_normalize_obs(model, {k: torch.from_numpy(np.stack([o[k] for o in observations]))
                                             for k in observations[0]})


def policy(cfg, env):
    import gymnasium as gym
    from sample_factory.model.actor_critic import create_actor_critic

    model = create_actor_critic(cfg, env.observation_space, gym.spaces.Discrete(env.action_space.n))
    model.eval()
    return model


def inference_and_rollout(cfg, seconds: float) -> list[dict]:
    import torch
    from sample_factory.model.model_utils import get_rnn_size

    n = cfg.num_envs_per_worker
    envs = agent_envs(cfg, n)
    model = policy(cfg, envs[0])
    obs = [env.reset()[0] for env in envs]
    rnn = torch.zeros(n, get_rnn_size(cfg))

    @torch.no_grad()
    def act(observations: list[dict]) -> np.ndarray:
        return model(observation_batch(model, observations), rnn)["actions"].reshape(-1).numpy()

    def forward() -> int:
        act(obs)
        return n

    def rollout() -> int:
        for _ in range(32):
            for i, a in enumerate(act(obs).tolist()):
                o, _, terminated, truncated, _ = envs[i].step(a)
                obs[i] = envs[i].reset()[0] if terminated or truncated else o
        return 32 * n

    rollout()
    rows = [row(f"inference (batch {n})", *measure(forward, seconds), unit="samples/s"),
            row(f"rollout: {n} envs + batched inference", *measure(rollout, seconds))]
    for env in envs:
        env.close()
    return rows


def recorded_messages(cfg, steps: int = 20_000) -> list[str]:
    """The messages of ``steps`` random steps of the agent's env, in order (what the reward wrapper is given)."""
    from pipeline.nethack.env import decode_message, make_env, seed_env

    env = make_env(cfg.nethack_task, extended_actions=cfg.nethack_extended_actions,
                   max_episode_steps=cfg.nethack_max_episode_steps, clock=cfg.nethack_clock)
    rng = np.random.default_rng(1)
    messages: list[str] = []
    game = 0
    while len(messages) < steps:
        seed_env(env, 10_000 + game)
        game += 1
        env.reset()
        done = False
        while not done and len(messages) < steps:
            obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            messages.append(decode_message(obs["message"]))
            done = terminated or truncated
    env.close()
    return messages


def intrinsic(cfg, tmp: Path, seconds: float) -> list[dict]:
    from bench_nethack_appo import stand_in_reward_model

    from pipeline.core.artifacts import atomic_write_json
    from pipeline.nethack import oni
    from pipeline.nethack.intrinsic import EpisodicIntrinsicReward
    from pipeline.nethack.sf import message_rewards, threshold_value

    messages = recorded_messages(cfg)
    unique = list(dict.fromkeys(messages))
    model_dir = tmp / "reward_model"
    stand_in_reward_model(model_dir)  # an untrained model of the trained one's shape, its table of messages
    rows = []

    def per_step(name: str, reward: EpisodicIntrinsicReward) -> dict:
        def replay() -> int:
            for k, m in enumerate(messages):
                if k % 1000 == 0:
                    reward.reset()  # a new episode every 1,000 steps
                reward.step(m, 0.0)
            return len(messages)

        replay()  # warm-up: first sights (Motif: scoring messages not in the table; ONI: spooling them)
        return row(name, *measure(replay, seconds))

    motif = EpisodicIntrinsicReward(message_rewards(str(model_dir)), ext_coef=0.1, int_coef=0.4,
                                    count_exponent=cfg.count_exponent,
                                    threshold=threshold_value(str(model_dir), 0.5))
    rows.append(per_step("intrinsic reward per step: Motif", motif))
    directory = tmp / "oni"
    directory.mkdir()
    atomic_write_json(directory / oni.TABLE, {"version": 1, "rewards": {m: 1.0 for m in unique[::2]}})
    online = EpisodicIntrinsicReward(oni.online_rewards(directory, cfg.oni_refresh_s), ext_coef=0.1, int_coef=0.4,
                                     count_exponent=cfg.count_exponent)
    rows.append(per_step("intrinsic reward per step: ONI classification", online))
    print(f"  (over {len(messages):,} recorded steps, {len(unique):,} distinct messages)")
    return rows


def full_agent(params, variant_name: str, tmp: Path, steps: int) -> list[dict]:
    """sample-factory's runner in this process, its profile on the CPU clock."""
    import sample_factory.utils.timing as sf_timing
    from sample_factory.train import make_runner

    from pipeline.nethack import sf
    from stages.rl_nethack import sf_args

    variant = params.rl_nethack.variants[variant_name]
    reward_dir = tmp / "reward_model"
    args = sf_args(params, variant_name, variant, tmp / "train", reward_dir) + [f"--train_for_env_steps={steps}"]
    cfg = sf.parse_cfg(args)
    cfg, runner = make_runner(cfg)
    if cfg.serial_mode:  # every component runs in this process: its clock can be the process's CPU time
        sf_timing.time = type("CpuClock", (), {"time": staticmethod(time.process_time)})
    if cfg.intrinsic_reward in sf.ONLINE_REWARDS and cfg.int_coef != 0:
        runner.register_observer(sf._online_annotation(cfg))
    status = runner.init()  # start-up (envs, model, the annotator process) is not a per-step cost
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if status == 0:
        status = runner.run()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    if status != 0:
        raise RuntimeError(f"bench: the APPO run failed (sample-factory status {status})")
    done = int(sum(runner.env_steps.values()))
    label = f"full APPO agent ({variant_name}, {'serial' if cfg.serial_mode else 'parallel'})"
    rows = [row(label, done, cpu, wall)]
    profiles = {name: dict(p) for name, p in runner.component_profiles}
    if cfg.serial_mode:
        learner = next(v for k, v in profiles.items() if k.startswith("Learner"))
        rows.append(row(f"learner (APPO, batch {cfg.batch_size})", done, learner["train"], learner["train"],
                        unit="samples/s"))
        rollout = sum(v.get("env_step", 0.0) for k, v in profiles.items() if k.startswith("RolloutWorker"))
        sampling = sum(sum(v.get(key, 0.0) for key in ("enqueue_policy_requests", "save_policy_outputs", "overhead",
                                                        "complete_rollouts"))
                       for k, v in profiles.items() if k.startswith("RolloutWorker"))
        inference = sum(v.get("handle_policy_step", 0.0) + v.get("update_model", 0.0)
                        for k, v in profiles.items() if k.startswith("InferenceWorker"))
        train = learner["train"] + learner.get("prepare_batch", 0.0)
        parts = {"env steps": rollout, "inference": inference, "learner": train, "rollout bookkeeping": sampling}
        parts["the rest (batching, summaries, checkpoints)"] = cpu - sum(parts.values())
        print("  the full agent's CPU seconds, by sample-factory's profile: " + ", ".join(
            f"{k} {v:.1f} s ({100 * v / cpu:.0f} %)" for k, v in parts.items()))
        rows[0]["split_cpu_s"] = {k: round(v, 2) for k, v in parts.items()}
    return rows


def main() -> None:
    from pipeline.nethack.clock import preload

    preload()  # NetHack's clock pinned (pipeline.nethack.clock), as the trainer pins it
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default=str(ROOT / "presets/nethack-oni-seeds.yaml"),
                        help="preset applied over --params ('' = none)")
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("-S", "--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a param override after the preset, e.g. -S rl_nethack.num_envs_per_worker=32")
    parser.add_argument("--variant", default="extrinsic", help="the agent of the full APPO run")
    parser.add_argument("--seconds", type=float, default=6.0, help="CPU seconds per part")
    parser.add_argument("--steps", type=int, default=65_536, help="env steps of the full APPO run")
    parser.add_argument("--cpu", type=int, default=None, help="the core to run on (default: the last allowed)")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--agent-only", action="store_true", help="only the full APPO agent (and its split)")
    only.add_argument("--split", action="store_true",
                      help="only the agent env's step split by whose code, and the policy's arithmetic")
    parser.add_argument("--json", default="", help="also write the rows to this file")
    args = parser.parse_args()

    import torch

    from pipeline.core.config import ConfigError, preset_overrides
    from pipeline.nethack import sf
    from pipeline.params import load_params
    from stages.rl_nethack import sf_args

    try:
        params = load_params(args.params, [*(preset_overrides(args.preset) if args.preset else []), *args.set])
    except ConfigError as e:
        fail(str(e))
    if args.variant not in params.rl_nethack.variants:
        fail(f"--variant {args.variant!r} is not one of the preset's agents ({', '.join(params.rl_nethack.variants)})")
    logging.getLogger("rl").setLevel(logging.ERROR)  # sample-factory's logger: its per-run chatter off
    cpu = args.cpu if args.cpu is not None else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    sf.register_components()
    rl = params.rl_nethack
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        # the agent's settings as the trainer parses them (the reward wrapper with no intrinsic reward)
        cfg = sf.parse_cfg(sf_args(params, "parts", rl.variants[args.variant].model_copy(
            update={"reward": "none", "int_coef": 0.0}), tmp / "train", tmp / "reward_model"))
        print(f"{cpu_name()}, core {cpu} of {os.cpu_count()}; {args.preset or args.params}: task {rl.task}, "
              f"{'extended' if rl.extended_actions else 'task'} actions, {cfg.num_envs_per_worker} envs per worker, "
              f"rollout {cfg.rollout}, batch {cfg.batch_size}, serial_mode {cfg.serial_mode}")
        if args.split:
            rows = [*env_split(cfg, args.seconds), *model_arithmetic(cfg, args.seconds)]
        elif args.agent_only:
            print(ROWS_HEADER)
            from bench_nethack_appo import stand_in_reward_model

            stand_in_reward_model(tmp / "reward_model")  # for a Motif agent
            rows = full_agent(params, args.variant, tmp, args.steps)
        else:
            print(ROWS_HEADER)
            rows = [nle_random(cfg, args.seconds), *agent_env(cfg, args.seconds),
                    *inference_and_rollout(cfg, args.seconds), *intrinsic(cfg, tmp, args.seconds),
                    *full_agent(params, args.variant, tmp, args.steps),
                    *env_split(cfg, args.seconds), *model_arithmetic(cfg, args.seconds)]
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_name(), "rows": rows}, indent=1,
                                              default=lambda v: v.item() if hasattr(v, "item") else str(v)))


if __name__ == "__main__":
    main()
