"""SIGTERM = checkpoint now (pipeline/core/interrupt.py), one test per kind of stage: a chunked stage, a Hugging Face
Trainer stage, rl-text's rounds, sample-factory; and under `dvc repro`.

Each test sends SIGTERM to a real `curio stage` mid-work, asserts exit 143 within runner.grace_s and the one line
naming where the rerun resumes, reruns, and compares with an uninterrupted run. It also prints what the rerun redoes
against what a SIGKILL at the same moment would make it redo: a SIGKILL keeps exactly what was on disk when it
landed (every write is atomic), which the test reads at the moment it sends SIGTERM (run with -s to see the figures).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import NETHACK_TINY, make_project, run_in_project, stage_here
from safetensors.torch import load_file

from pipeline.core.artifacts import read_manifest, read_part, read_rows
from pipeline.core.config import RunnerConfig

GRACE_S = RunnerConfig().grace_s
# A built-in policy small enough to train in about a minute, long enough (200 steps, no periodic checkpoint before
# step 50) for a SIGTERM to land mid-training.
BOOTSTRAP = ["bootstrap.episodes=400", "bootstrap.epochs=2", "bootstrap.n_layer=2", "bootstrap.n_embd=64",
             "bootstrap.n_head=2", "bootstrap.vocab_size=800", "bootstrap.batch_size=4", "bootstrap.n_positions=512"]
ROLLOUT = ["games.max_train_tasks=12", "rollout_text.trajectories_per_task=2", "rollout_text.tasks_per_chunk=2",
           "rollout_text.max_new_tokens=16"]
ARCHER = ["games.max_train_tasks=6", "rollout_text.max_new_tokens=16", "rl_text.algorithm=archer", "rl_text.rounds=3",
          "rl_text.tasks_per_round=3", "rl_text.trajectories_per_task=2", "rl_text.critic.steps=2",
          "rl_text.critic.batch_size=4", "rl_text.archer.actor_steps=1", "rl_text.archer.batch_size=2",
          "rl_text.archer.warmup_rounds=1"]
LINE = re.compile(r"^curio: stopped by SIGTERM: (?P<stage>[\w-]+) resumes at (?P<where>.+)$")


def start(args: list[str], cwd: Path, err: Path) -> subprocess.Popen:
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONUNBUFFERED": "1",
           "MLFLOW_TRACKING_URI": f"sqlite:///{cwd}/mlflow.db"}
    return subprocess.Popen([sys.executable, "-m", "pipeline.cli", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=open(err, "w"))  # noqa: SIM115 - the child holds it


def term_when(proc: subprocess.Popen, ready, timeout: float = 600) -> float:
    """SIGTERM once ``ready()``; the time it was sent."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, "the stage ended before it could be stopped"
        if ready():
            proc.send_signal(signal.SIGTERM)
            return time.monotonic()
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the stage never reached the point to stop it at")


def stopped(proc: subprocess.Popen, sent: float, err: Path, stage: str, grace_s: float = GRACE_S) -> str:
    """Exit 143 within the grace period, one line and no traceback on stderr; returns where it resumes."""
    try:
        rc = proc.wait(timeout=grace_s + 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"{stage} still running {grace_s + 30} s after SIGTERM") from None
    elapsed = time.monotonic() - sent
    text = err.read_text()
    assert rc == 143, f"exit {rc}:\n{text[-3000:]}"
    assert elapsed <= grace_s, f"stopped {elapsed:.1f} s after SIGTERM (grace {grace_s} s)"
    assert "Traceback" not in text, text[-3000:]
    lines = [m for line in text.splitlines() if (m := LINE.match(line))]
    assert len(lines) == 1 and lines[0]["stage"] == stage, text[-3000:]
    return lines[0]["where"]


def first_checkpoint(ckpts: Path) -> bool:
    """The Trainer's first periodic checkpoint (step 50 of bootstrap's 200) is on disk."""
    return (ckpts / "checkpoint-50" / "trainer_state.json").exists()


def sigterm_pending(pid: int) -> bool:
    """SIGTERM was sent to ``pid`` and waits, undelivered (the process is stopped): /proc's pending-signal masks."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    masks = [int(line.split()[1], 16) for line in status.splitlines() if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(mask & (1 << (signal.SIGTERM - 1)) for mask in masks)


def weights_equal(a: Path, b: Path) -> bool:
    x, y = load_file(str(a)), load_file(str(b))
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.fixture(scope="module")
def bootstrapped(tmp_path_factory) -> Path:
    """An uninterrupted tiny bootstrap (the built-in policy of the tests below, and the HF Trainer's reference)."""
    proj = make_project(tmp_path_factory.mktemp("bootstrapped"), ["tracking.enabled=false", *BOOTSTRAP])
    stage_here("bootstrap", proj)
    return proj


def test_a_chunked_stage_finishes_its_chunk_in_flight_and_resumes_after_it(bootstrapped, tmp_path):
    grace_s = 60  # the chunk in flight finishes well within two thirds of it, however loaded the machine
    runs = {}
    for name in ("straight", "stopped"):
        (tmp_path / name).mkdir()
        runs[name] = make_project(tmp_path / name, [*BOOTSTRAP, *ROLLOUT, f"runner.grace_s={grace_s}"])  # MLflow on
        (runs[name] / "data").mkdir()
        os.symlink(bootstrapped / "data" / "bootstrap", runs[name] / "data" / "bootstrap")
    stage_here("rollout-text", runs["straight"], ["tracking.enabled=false"])  # the reference: its rows only
    out = runs["stopped"] / "data" / "rollout_text"
    err = tmp_path / "stderr.txt"
    proc = start(["stage", "rollout-text"], runs["stopped"], err)
    # A part is written a moment before the loop checks for a stop: a signal in that moment stops the stage with no
    # chunk in flight. So it is sent a while after the last part landed (a third of the straight run's time per
    # chunk, from its parts' mtimes), once no new part appeared meanwhile: the next chunk is then surely running.
    straight = runs["straight"] / "data" / "rollout_text"
    straight_parts = read_manifest(straight)["parts"]
    times = sorted((straight / info["file"]).stat().st_mtime for info in straight_parts.values())
    settle = max(0.2, (times[-1] - times[0]) / (len(times) - 1) / 3)
    at_signal: list[int] = []

    def mid_chunk() -> bool:
        m = read_manifest(out)
        if m is None or len(m["parts"]) < 1:
            return False
        time.sleep(settle)
        if len(read_manifest(out)["parts"]) != len(m["parts"]):
            return False  # another part landed meanwhile: wait for the chunk after it
        at_signal.append(len(m["parts"]))  # what a SIGKILL now would keep
        return True

    sent = term_when(proc, mid_chunk)
    where = stopped(proc, sent, err, "rollout-text", grace_s)
    kept = read_manifest(out)
    total = len(straight_parts)
    assert not kept["complete"] and at_signal[0] < len(kept["parts"]) < total  # the chunk in flight was finished
    assert where == f"chunk {len(kept['parts']) + 1} of {total} (data/rollout_text)"
    import sqlite3

    with sqlite3.connect(runs["stopped"] / "mlflow.db") as db:  # the MLflow run was ended, not left running
        assert [s for (s,) in db.execute("select status from runs")] == ["KILLED"]

    stage_here("rollout-text", runs["stopped"])
    after = read_manifest(out)
    assert all(after["parts"][k]["sha256"] == v["sha256"] for k, v in kept["parts"].items())
    assert read_rows(out) == read_rows(runs["straight"] / "data" / "rollout_text")
    print(f"\nrollout-text, chunks the rerun computes again: SIGTERM {total - len(kept['parts'])} of {total} "
          f"(0 of the work done before the stop); a SIGKILL at the same moment {total - at_signal[0]} of {total} "
          "(the chunk in flight lost)")


def test_a_trainer_stage_saves_the_step_it_is_on_and_resumes_there(bootstrapped, tmp_path):
    proj = make_project(tmp_path, ["tracking.enabled=false", *BOOTSTRAP])
    err = tmp_path / "stderr.txt"
    proc = start(["stage", "bootstrap"], proj, err)
    logged: list[int] = []
    assert proc.stdout is not None
    for line in proc.stdout:  # the Trainer prints its loss every 5 steps (no progress bar)
        if "'loss'" in line:
            logged.append(len(logged) * 5 + 5)
            if len(logged) == 4:
                break
    ckpts = proj / "data" / "bootstrap" / "checkpoints"
    on_disk = max((int(p.name.split("-")[1]) for p in ckpts.glob("checkpoint-*")), default=0)  # a SIGKILL's
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    proc.stdout.read()
    where = stopped(proc, sent, err, "bootstrap")
    saved = int(re.fullmatch(r"step (\d+) of 200", where)[1])
    assert saved >= logged[-1] and (ckpts / f"checkpoint-{saved}" / "trainer_state.json").exists()

    stage_here("bootstrap", proj)
    metrics = json.loads((proj / "metrics" / "stages" / "bootstrap.json").read_text())
    assert metrics["resumed_from_step"] == saved
    assert weights_equal(proj / "data" / "bootstrap" / "model" / "model.safetensors",
                         bootstrapped / "data" / "bootstrap" / "model" / "model.safetensors")
    # and its last checkpoint's log: TRL's count of the tokens trained on goes on from the stop (kept in each
    # checkpoint). The Trainer averages its loss (TRL: entropy, token accuracy) over the steps since the last log:
    # the first log after a resume between two logs averages the steps since the resume only; every other is the same
    last = ckpts / "checkpoint-200" / "trainer_state.json"
    log = json.loads(last.read_text())["log_history"]
    straight = json.loads((bootstrapped / last.relative_to(proj)).read_text())["log_history"]
    assert [h["num_tokens"] for h in log] == [h["num_tokens"] for h in straight]
    window = ("loss", "entropy", "mean_token_accuracy")
    for h, g in zip(log, straight, strict=True):
        if h["step"] - saved in range(1, 5) and saved % 5:  # logging_steps=5
            h, g = ({k: v for k, v in x.items() if k not in window} for x in (h, g))
        assert h == g
    print(f"\nbootstrap (HF Trainer), optimizer steps the rerun trains again: SIGTERM 0 (stopped at step {saved}, "
          f"resumed there); a SIGKILL at the same moment at least {logged[-1] - on_disk} (resumes at step {on_disk})")


def test_rl_text_rounds_keep_the_episodes_in_flight_and_resume_as_if_never_stopped(bootstrapped, tmp_path):
    runs = {}
    for name in ("straight", "stopped"):
        (tmp_path / name).mkdir()
        runs[name] = make_project(tmp_path / name, ["tracking.enabled=false", *BOOTSTRAP, *ARCHER,
                                                    "runner.grace_s=60"])  # the round's episodes finish in it
        (runs[name] / "data" / "train_policy").mkdir(parents=True)
        os.symlink(bootstrapped / "data" / "bootstrap", runs[name] / "data" / "bootstrap")
        os.symlink(bootstrapped / "data" / "bootstrap" / "model", runs[name] / "data" / "train_policy" / "dpo")
    stage_here("rl-text", runs["straight"])
    out = runs["stopped"] / "data" / "rl_text"
    err = tmp_path / "stderr.txt"
    proc = start(["stage", "rl-text"], runs["stopped"], err)
    sent = term_when(proc, lambda: (out / "state" / "round-000" / "DONE").exists())  # round 2 is being played
    where = stopped(proc, sent, err, "rl-text", 60)
    # round 2's episodes are kept (a SIGKILL would lose them): the rerun redoes its gradient steps, or nothing
    assert where in ("round 2 of 3 (its episodes played)", "round 3 of 3"), where
    parts = sorted(int(k) for k in read_manifest(out / "replay")["parts"])
    assert 1 in parts
    played = sum(len(read_part(out / "replay", i, ["round"])) for i in parts)

    stage_here("rl-text", runs["stopped"])
    straight = runs["straight"] / "data" / "rl_text"
    assert read_rows(out / "replay") == read_rows(straight / "replay")
    for f in ("model/model.safetensors", "state/round-002/critic/heads.safetensors"):
        assert weights_equal(out / f, straight / f), f
    episodes = 3 * 2  # rl_text.tasks_per_round x trajectories_per_task
    print(f"\nrl-text (ArCHer rounds), episodes the rerun plays again: SIGTERM 0 (stopped at {where}, {played} "
          f"transitions kept); a SIGKILL at the same moment {episodes} (round 2's, in flight)")


def test_a_trainer_signalled_while_torch_starts_its_shared_memory_manager_goes_on(tmp_path):
    """sample-factory's first shared tensor starts torch's shared-memory manager; a signal with a handler landing
    in that start made torch spin for ever, holding the GIL (an orphaned trainer in the 100-interruption soak). The
    trainer starts it with the stop signals blocked: under SIGTERM every 2 ms it comes up, and the signals are
    handled after. (Without the blocking, the same child never ends: `torch.zeros(1).share_memory_()` under the
    file_system strategy hung 3 times out of 3.)"""
    child = tmp_path / "child.py"
    child.write_text(
        "import signal, time\n"
        "from pipeline.nethack.sf_process import start_shm_manager\n"
        "got = []\n"
        "signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))\n"
        "print('ready', flush=True)\n"
        "time.sleep(0.3)\n"
        "start_shm_manager()\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', len(got), flush=True)\n")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, str(child)], stdout=subprocess.PIPE, text=True, cwd=root,
                            env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.002)
    if proc.poll() is None:
        proc.kill()
        raise AssertionError("the child hung starting torch's shared-memory manager")
    out = proc.stdout.read().split()
    assert proc.returncode == 0 and out[0] == "up" and int(out[1]) > 0  # the signals were handled, after


def test_a_trainer_that_cannot_reach_the_end_of_its_iteration_exits_at_its_grace_period(tmp_path):
    """A trainer asked to stop ends at the end of its training iteration; one still starting (three trainers
    starting at once on two cores took 23 s in the 100-interruption soak) exits 143 at the grace period the stage
    gave it, its own children killed, instead of outliving the stage's grace period."""
    child = tmp_path / "child.py"
    pids = tmp_path / "grandchild.pid"
    child.write_text(
        "import subprocess, sys, time\n"
        "from pipeline.nethack.sf_process import StopRequest, grace_from_env\n"
        "stop = StopRequest(grace_from_env())\n"
        "stop.install()\n"
        f"worker = subprocess.Popen(['sleep', '600'])\n"
        f"open({str(pids)!r}, 'w').write(str(worker.pid))\n"
        "print('ready', flush=True)\n"
        "for _ in range(600):\n"
        "    time.sleep(0.1)  # a long start, no iteration ends\n"
        "print('never stopped', flush=True)\n")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, str(child)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=root, env={**os.environ, "PYTHONPATH": str(root), "CURIO_TRAINER_GRACE_S": "1.5"})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    worker = int(pids.read_text())
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the trainer outlived its grace period by 28 s") from None
    elapsed = time.monotonic() - sent
    assert rc == 143 and 1.4 <= elapsed <= 5, (rc, elapsed)
    assert "resumes from its last checkpoint" in proc.stderr.read()
    time.sleep(0.5)
    status = Path(f"/proc/{worker}/status")
    assert not status.exists() or "zombie" in status.read_text(), "its child is still running"


def test_a_stage_passes_half_its_grace_period_to_the_trainers_it_starts():
    """The bound a trainer gets is read from the stop block it runs under (the stage's runner.grace_s)."""
    from pipeline.core import interrupt

    assert interrupt.grace_period() is None
    with interrupt.stopping("x", grace_s=12.0):
        assert interrupt.grace_period() == 12.0
    with interrupt.stopping("x", grace_s=None):
        assert interrupt.grace_period() is None


def test_sample_factory_ends_its_iteration_with_a_checkpoint_and_resumes_there(tmp_path):
    from pipeline.nethack.sf import latest_checkpoint

    proj = make_project(tmp_path, [*NETHACK_TINY, "rl_nethack.train_for_env_steps=500000",
                                   "rl_nethack.variants={ext: {ext_coef: 1.0, int_coef: 0.0}}",
                                   "evaluate_nethack.policies=[random, ext]"])
    experiment = proj / "data" / "rl_nethack" / "ext"
    err = tmp_path / "stderr.txt"
    proc = start(["stage", "rl-nethack"], proj, err)
    seen: list[tuple[int, int]] = []

    def trained_a_while() -> bool:  # sample-factory's log says how far it is every 5 s; it saves every 30 s
        log = experiment / "curio_train.log"
        frames = [int(f) for f in re.findall(r"Total num frames: (\d+)", log.read_text())] if log.exists() else []
        if frames and frames[-1] >= 2048:
            seen.append((frames[-1], (latest_checkpoint(experiment) or (None, 0))[1]))  # a SIGKILL resumes there
            return True
        return False

    sent = term_when(proc, trained_a_while, timeout=300)
    where = stopped(proc, sent, err, "rl-nethack")
    saved = latest_checkpoint(experiment)[1]
    frames, on_disk = seen[0]
    assert where == f"ext at {saved} of 500000 env steps"
    assert saved >= frames > on_disk

    stage_here("rl-nethack", proj, [f"rl_nethack.train_for_env_steps={saved + 1024}"])
    metrics = json.loads((proj / "metrics" / "stages" / "rl-nethack.json").read_text())
    assert metrics["ext/resumed_from_env_steps"] == saved and metrics["ext/env_steps"] >= saved + 1024
    print(f"\nrl-nethack (sample-factory), env steps the rerun trains again: SIGTERM 0 (checkpoint at {saved}, "
          f"resumed there); a SIGKILL of its processes at the same moment at least {frames - on_disk} (resumes at "
          f"{on_disk})")


def test_under_dvc_repro_the_stage_gets_sigterm_and_the_rerun_resumes(bootstrapped, tmp_path):
    """`kill DVC_PID`: DVC dies of it without passing it on; the stage gets SIGTERM when DVC dies (curio stage
    under DVC), saves its step and stops with the same line; the next `dvc repro` resumes there."""
    import psutil
    import yaml

    proj = make_project(tmp_path, ["tracking.enabled=false", *BOOTSTRAP])
    spec = yaml.safe_load((proj / "dvc.yaml").read_text())
    (proj / "dvc.yaml").write_text(yaml.safe_dump(
        {"stages": {n: spec["stages"][n] for n in ("check-params", "bootstrap")}}, sort_keys=False))
    shutil.copy(Path(__file__).resolve().parents[1] / ".gitignore", proj / ".gitignore")
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"]):
        run_in_project(cmd, proj)
    # DVC runs the cmd with $SHELL -c; dash (Debian's /bin/sh, DVC's default) forks for it, so the stage's parent
    # is the shell, which outlives DVC: the harder case
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(proj), "SHELL": "/bin/sh",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    err = tmp_path / "stderr.txt"
    dvc = subprocess.Popen(["dvc", "repro", "bootstrap"], cwd=proj, env=env, stdout=subprocess.DEVNULL,
                           stderr=open(err, "w"))  # noqa: SIM115
    ckpts = proj / "data" / "bootstrap" / "checkpoints"

    def command(p: psutil.Process) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:  # DVC's short-lived children (git, the shell's own) end while being listed
            return ""

    def training() -> list[psutil.Process]:
        stage = [p for p in psutil.Process(dvc.pid).children(recursive=True) if "bootstrap" in command(p)]
        return stage if stage and first_checkpoint(ckpts) else []

    deadline = time.time() + 300
    while not (stage := training()) and time.time() < deadline:
        assert dvc.poll() is None, err.read_text()[-3000:]
        time.sleep(0.05)
    assert stage, "bootstrap never started training under dvc repro"
    # at step 50 of 200: 150 steps (2.5 s on an idle machine, more on a loaded one) to go, against the
    # milliseconds DVC's death takes to reach the stage
    dvc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    dvc.wait(timeout=30)
    _, alive = psutil.wait_procs(stage, timeout=GRACE_S + 30)
    assert not alive
    assert time.monotonic() - sent <= GRACE_S
    text = err.read_text()
    lines = [m for line in text.splitlines() if (m := LINE.match(line))]
    assert len(lines) == 1 and lines[0]["stage"] == "bootstrap" and "Traceback" not in text, text[-3000:]
    saved = int(re.fullmatch(r"step (\d+) of 200", lines[0]["where"])[1])
    assert saved > 0 and (ckpts / f"checkpoint-{saved}").exists()

    run_in_project(["dvc", "repro", "bootstrap"], proj)
    metrics = json.loads((proj / "metrics" / "stages" / "bootstrap.json").read_text())
    assert metrics["resumed_from_step"] == saved
    assert weights_equal(proj / "data" / "bootstrap" / "model" / "model.safetensors",
                         bootstrapped / "data" / "bootstrap" / "model" / "model.safetensors")


LAUNCHED = """
import pathlib, signal, sys, time
from pipeline.core.interrupt import stop_when_launcher_dies
signal.signal(signal.SIGTERM, lambda *_: (pathlib.Path(sys.argv[1]).write_text("SIGTERM"), sys.exit(0)))
stop_when_launcher_dies(poll_s=0.1)
pathlib.Path(sys.argv[2]).write_text("ready")
time.sleep(120)
"""


@pytest.mark.parametrize("shell", ["/bin/sh", "/bin/bash"])
def test_a_stage_gets_sigterm_when_its_launcher_dies_behind_a_shell(shell, tmp_path):
    """DVC runs a stage's cmd as `$SHELL -c CMD`: bash execs the command (DVC is the stage's parent), dash forks
    for it (the shell is, and outlives DVC). Either way the stage gets SIGTERM once the launcher is gone."""
    script, got, ready = tmp_path / "stage.py", tmp_path / "got", tmp_path / "ready"
    script.write_text(LAUNCHED)
    cmd = f"{sys.executable} {script} {got} {ready}"
    launcher = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                                 f"subprocess.Popen([{shell!r}, '-c', sys.argv[1]]); time.sleep(120)", cmd],
                                env={**os.environ, "DVC_STAGE": "bootstrap", "PYTHONPATH": os.getcwd()})
    deadline = time.time() + 60
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert ready.exists(), "the launched process never started"
    time.sleep(0.5)
    assert not got.exists()  # nothing happens while the launcher lives
    launcher.kill()
    launcher.wait()
    deadline = time.time() + 10
    while not got.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert got.exists() and got.read_text() == "SIGTERM"


def test_two_training_processes_save_the_same_step_and_resume_there(tmp_path):
    """`accelerate launch` (2 gloo processes): the stage's SIGTERM goes to the launcher, torchrun passes it to both
    processes, they agree on the step (a reduced flag), rank 0 saves it, and the stage stops naming it; 2 processes
    resume it."""
    import threading

    from pipeline.core import interrupt
    from pipeline.core.processes import use_processes
    from pipeline.models import tiny
    from pipeline.models.training import sft_train

    def conversation(i: int) -> list[dict]:
        return [{"role": "user", "content": f"Clue {i}: name an animal."},
                {"role": "assistant", "content": f"<Answer>animal {i % 7}</Answer>"}]

    convs = [conversation(i) for i in range(40)]
    tok = tiny.train_tokenizer([tiny.conversation_text(c) for c in convs], 300)
    model = tiny.build_model(tok, n_layer=1, n_embd=32, n_head=2, n_positions=128, seed=0)
    kw = dict(lr=5e-3, epochs=30, batch_size=4, warmup_ratio=0.0, seed=0, save_steps=20)  # 300 steps
    ckpt = tmp_path / "two"

    def term_after_first_checkpoint() -> None:
        while not (ckpt / "checkpoint-20" / "trainer_state.json").exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=term_after_first_checkpoint, daemon=True).start()
    with use_processes(2), pytest.raises(interrupt.Stopped) as stop, interrupt.stopping("train-sft"):
        sft_train(model, tok, convs, ckpt, **kw)
    assert stop.value.exit_code == 143
    saved = int(re.fullmatch(r"stopped by SIGTERM: train-sft resumes at step (\d+)", str(stop.value))[1])
    assert saved > 20 and (ckpt / f"checkpoint-{saved}" / "trainer_state.json").exists()
    with use_processes(2):
        resumed_model, _, resumed = sft_train(model, tok, convs, ckpt, **kw)
        straight, _, _ = sft_train(model, tok, convs, tmp_path / "straight", **kw)
    assert resumed == saved
    a, b = resumed_model.state_dict(), straight.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # the weights of an uninterrupted run


def test_a_prefect_flow_run_cancelled_through_the_api_stops_its_stage_and_the_next_run_resumes(bootstrapped,
                                                                                                tmp_path, prefect_home):
    """The `pipeline` deployment run by a process worker against a real Prefect server: cancelling the flow run
    (the API's CANCELLING state) makes the worker SIGTERM its process; the stage in it saves its step and says so in
    the run's log; the next flow run resumes there (dvc.lock kept as `dvc repro` would)."""
    import json as _json
    import urllib.request

    import psutil
    from test_prefect_deploy import _api, _free_port, _stop, _wait_healthy

    proj = make_project(tmp_path, ["tracking.enabled=false", *BOOTSTRAP])
    shutil.copy(Path(__file__).resolve().parents[1] / "prefect.yaml", proj / "prefect.yaml")
    shutil.copy(Path(__file__).resolve().parents[1] / ".gitignore", proj / ".gitignore")
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"]):
        run_in_project(cmd, proj)
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    prefect = str(Path(sys.executable).with_name("prefect"))
    env = {**os.environ, "PREFECT_HOME": str(prefect_home), "PREFECT_API_URL": url,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONPATH": str(proj), "TQDM_DISABLE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 - closed with the processes below
    server = subprocess.Popen([prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                              cwd=proj, stdout=log, stderr=subprocess.STDOUT)
    worker = None
    try:
        _wait_healthy(url, server)
        _api(url, "/work_pools/", {"name": "curio", "type": "process"})
        res = subprocess.run([prefect, "--no-prompt", "deploy", "--all"], env=env, cwd=proj, capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        flows = {f["id"]: f["name"] for f in _api(url, "/flows/filter", {})}
        deployment = next(d["id"] for d in _api(url, "/deployments/filter", {})
                          if flows[d["flow_id"]] == "pipeline")
        worker = subprocess.Popen([prefect, "worker", "start", "--pool", "curio"], cwd=proj, stdout=log,
                                  stderr=subprocess.STDOUT, env={**env, "PREFECT_WORKER_QUERY_SECONDS": "1"})
        parameters = {"stages": ["check-params", "bootstrap"]}

        def run_to_the_end(flow_run: str, timeout: float = 600) -> dict:
            deadline = time.time() + timeout
            while time.time() < deadline:
                state = _api(url, f"/flow_runs/{flow_run}")
                if state["state_type"] in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}:
                    return state
                time.sleep(0.5)
            raise AssertionError(f"flow run {flow_run} did not end")

        first = _api(url, f"/deployments/{deployment}/create_flow_run", {"parameters": parameters})["id"]
        ckpts = proj / "data" / "bootstrap" / "checkpoints"
        deadline = time.time() + 600
        while not first_checkpoint(ckpts):
            assert time.time() < deadline, "bootstrap never reached its first checkpoint"
            time.sleep(0.05)
        # The flow run's processes are paused (SIGSTOP) from step 50 until the worker's SIGTERM is pending in them,
        # so the 150 steps left cannot end before the cancel arrives, however long the worker takes to poll.
        run = psutil.Process(worker.pid).children(recursive=True)
        for proc in run:
            proc.suspend()
        try:
            req = urllib.request.Request(f"{url}/flow_runs/{first}/set_state", method="POST",
                                         headers={"Content-Type": "application/json"},
                                         data=_json.dumps({"state": {"type": "CANCELLING"}, "force": True}).encode())
            urllib.request.urlopen(req, timeout=10).read()
            deadline = time.time() + 120
            while not any(sigterm_pending(proc.pid) for proc in run):
                assert time.time() < deadline, "the worker never sent SIGTERM to the flow run"
                time.sleep(0.1)
        finally:
            for proc in run:
                if proc.is_running():
                    proc.resume()
        cancelled = time.monotonic()
        state = run_to_the_end(first)
        assert state["state_type"] == "CANCELLED", state["state_type"]
        assert time.monotonic() - cancelled <= GRACE_S + 15  # the stop, then the worker sees the process end
        deadline = time.time() + 60
        while True:  # the run's logs reach the API in batches
            logs = [entry["message"] for entry in _api(url, "/logs/filter", {"sort": "TIMESTAMP_DESC", "limit": 200})
                    if entry["level"] >= 30]  # warnings and errors
            lines = [m for text in logs for line in text.splitlines() if (m := LINE.match(line))]
            if lines or time.time() > deadline:
                break
            time.sleep(1)
        assert len(lines) == 1 and lines[0]["stage"] == "bootstrap", logs[-20:]
        # no traceback through Curio's code (Prefect's engine logs the run's CancelledRun from its own frames)
        ours = [t for t in logs if "Traceback" in t and ("/pipeline/" in t or "/stages/" in t)]
        assert not ours, ours[:1]
        saved = int(re.fullmatch(r"step (\d+) of 200", lines[0]["where"])[1])
        assert (ckpts / f"checkpoint-{saved}" / "trainer_state.json").exists()

        assert server.poll() is None, "the Prefect server ended"
        second = _api(url, f"/deployments/{deployment}/create_flow_run", {"parameters": parameters})["id"]
        assert run_to_the_end(second)["state_type"] == "COMPLETED"
        metrics = json.loads((proj / "metrics" / "stages" / "bootstrap.json").read_text())
        assert metrics["resumed_from_step"] == saved
        assert weights_equal(proj / "data" / "bootstrap" / "model" / "model.safetensors",
                             bootstrapped / "data" / "bootstrap" / "model" / "model.safetensors")
    finally:
        if worker is not None:
            _stop(worker)
        _stop(server)
        log.close()


STUCK = """
import os, signal, sys, time
from pipeline.core import interrupt
with interrupt.stopping("rollout-text", grace_s=3), interrupt.at("chunk 2 of 4 (data/rollout_text)"):
    os.kill(os.getpid(), signal.SIGTERM)
    {body}
"""


@pytest.mark.parametrize("stuck", [False, True])
def test_work_in_flight_is_dropped_late_in_the_grace_period_and_the_process_exits_at_its_end(stuck):
    """A chunk that would outlast the grace period: dropped two thirds into it (Stopped raised in the main thread,
    the blocks unwind); code that swallows even that is ended at the grace period with the same line."""
    body = ("while True:\n        try:\n            time.sleep(60)\n        except interrupt.Stopped:\n"
            "            pass" if stuck else "time.sleep(60)")
    started = time.monotonic()
    res = subprocess.run([sys.executable, "-c", STUCK.format(body=body)], capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - started
    line = "stopped by SIGTERM: rollout-text resumes at chunk 2 of 4 (data/rollout_text)"
    assert elapsed < 3 + 5  # the grace period (3 s), and the interpreter's start
    if stuck:  # the grace period's end: the process exits, saying the same
        assert res.returncode == 143 and res.stderr.strip() == f"curio: {line}"
    else:  # dropped at 2 s: the exception, with the line, unwinds the blocks
        assert res.returncode == 1 and res.stderr.strip().endswith(f"pipeline.core.interrupt.Stopped: {line}")


def test_a_second_sigterm_inside_the_handler_of_the_first_changes_nothing():
    """A SIGTERM to the process group, then another as DVC dies: the second runs the handler again, in the same
    thread, while the first is still in it (the moment is forced here); the stage stops as after one."""
    script = STUCK.format(body="pass").replace(
        "    os.kill(os.getpid(), signal.SIGTERM)\n",
        "    with interrupt._STATE.lock:  # as the first signal's handler holds it\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(0.2)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    interrupt.check()\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and res.stderr.strip().endswith(
        "Stopped: stopped by SIGTERM: rollout-text resumes at chunk 2 of 4 (data/rollout_text)"), res.stderr[-2000:]
