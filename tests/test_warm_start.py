"""The warm start under `make run` (pipeline/stage_server.py, pipeline/core/warm.py): a `curio` command DVC runs
runs in a copy of one process that has loaded torch, transformers and Curio once, with the same output, exit code,
working directory and signals as when it loads them itself; a command that starts while the server loads waits for
it; a request from another environment is declined and runs itself; a SIGKILL of the command leaves nothing running;
`python -m pipeline.orchestration.run_dvc` starts and stops the server."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
import test_locks  # noqa: E402

from pipeline.core import warm as warm_client  # noqa: E402

project = test_locks.project  # the fixture: a small rollout for annotate-text, tracking off

REPO = Path(__file__).resolve().parents[1]
CURIO = str(Path(sys.executable).parent / "curio")


def base_env(**extra: str) -> dict[str, str]:
    """One environment for the server and its commands (PYTHONPATH: this checkout, whatever the venv points to)."""
    inherited = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}  # pytest changes it per phase
    return {**inherited, "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1", "CURIO_WAIT": "", "CURIO_WARM_VERBOSE": "1",
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **extra}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A running server, shared by this file's tests; (socket path, its stderr file)."""
    where = tmp_path_factory.mktemp("warm")
    path, log = where / "warm.sock", where / "server.err"
    with open(log, "w") as err:
        proc = warm_client.start_server(str(path), env=base_env(), stderr=err, stdin=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not path.exists():
        assert proc.poll() is None, log.read_text()
        assert time.time() < deadline, "the server never bound its socket"
        time.sleep(0.2)
    yield path, log
    proc.terminate()
    proc.wait(timeout=30)


def warm(path: Path, **extra: str) -> dict[str, str]:
    return base_env(DVC_STAGE="test", CURIO_WARM_SOCKET=str(path), **extra)


def copies(server_log: Path) -> list[int]:
    """The pids the server says it ran commands in."""
    return [int(line.rsplit("pid ", 1)[1].rstrip(")")) for line in server_log.read_text().splitlines()
            if "runs in a copy" in line]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_command_runs_in_a_copy_with_its_output_and_exit_code(server, tmp_path):
    path, log = server
    before = len(copies(log))
    direct = subprocess.run([CURIO, "params", "-S", "seed=7"], env=base_env(), capture_output=True, text=True)
    copied = subprocess.run([CURIO, "params", "-S", "seed=7"], env=warm(path), capture_output=True, text=True)
    assert copied.returncode == direct.returncode == 0, copied.stderr
    assert copied.stdout == direct.stdout and '"seed": 7' in copied.stdout
    assert copied.stderr == ""
    assert len(copies(log)) == before + 1

    bad = subprocess.run([CURIO, "stage", "nope"], env=warm(path), capture_output=True, text=True, cwd=REPO)
    direct_bad = subprocess.run([CURIO, "stage", "nope"], env=base_env(), capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == direct_bad.returncode == 2
    assert bad.stderr == direct_bad.stderr and bad.stderr.startswith("curio: unknown stage 'nope'")
    assert len(copies(log)) == before + 2


def test_the_copy_runs_in_the_commands_directory(server, tmp_path):
    path, log = server
    before = len(copies(log))
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["seed"] = 11
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))  # another checkout's params, read from the cwd
    res = subprocess.run([CURIO, "params"], env=warm(path), capture_output=True, text=True, cwd=tmp_path)
    direct = subprocess.run([CURIO, "params"], env=base_env(), capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == direct.returncode == 0, (res.stderr, direct.stderr)
    assert res.stdout == direct.stdout and '"seed": 11' in res.stdout
    assert len(copies(log)) == before + 1


def test_a_request_from_another_environment_is_declined_and_runs_itself(server):
    path, log = server
    before = len(copies(log))
    res = subprocess.run([CURIO, "params", "-S", "seed=3"], env=warm(path, OMP_NUM_THREADS="3"), capture_output=True,
                         text=True, cwd=REPO)
    assert res.returncode == 0 and '"seed": 3' in res.stdout
    assert res.stderr.splitlines() == [
        "curio: the warm start declined ($OMP_NUM_THREADS differs from the server's); loading everything here"]
    assert len(copies(log)) == before


def test_a_command_with_no_server_started_runs_itself(tmp_path):
    res = subprocess.run([CURIO, "params", "-S", "seed=5"], env=warm(tmp_path / "none.sock"), capture_output=True,
                         text=True, cwd=REPO)
    assert res.returncode == 0 and '"seed": 5' in res.stdout and res.stderr == ""


def test_a_command_waits_for_a_loading_server_and_runs_itself_if_it_dies(tmp_path):
    """The loading lock held (a server loading) and no socket: the command waits; let go with no socket (the server
    died while loading): it runs itself, as without a server."""
    t0 = time.monotonic()
    alone = subprocess.run([CURIO, "params", "-S", "seed=4"], env=base_env(), capture_output=True, text=True, cwd=REPO)
    alone_s = time.monotonic() - t0
    path = tmp_path / "dies.sock"
    fd = os.open(warm_client.loading_lock(str(path)), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        cmd = subprocess.Popen([CURIO, "params", "-S", "seed=4"], env=warm(path), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=REPO)
        time.sleep(max(3.0, 2 * alone_s))  # twice what the command takes alone
        assert cmd.poll() is None, cmd.communicate()
    finally:
        os.close(fd)
    out, err = cmd.communicate(timeout=120)
    assert cmd.returncode == 0 and out == alone.stdout and '"seed": 4' in out and err == ""


def test_a_command_started_while_the_server_loads_runs_in_a_copy(tmp_path):
    """`start_server` as run_dvc calls it, and a command at once: it waits for the socket and runs in a copy."""
    path, log = tmp_path / "warm.sock", tmp_path / "server.err"
    with open(log, "w") as err:
        proc = warm_client.start_server(str(path), env=base_env(), stderr=err, stdin=subprocess.DEVNULL)
    try:
        assert not path.exists()  # it takes seconds to load
        res = subprocess.run([CURIO, "params", "-S", "seed=8"], env=warm(path), capture_output=True, text=True,
                             cwd=REPO, timeout=300)
        assert res.returncode == 0 and '"seed": 8' in res.stdout and res.stderr == "", res.stderr
        assert len(copies(log)) == 1, log.read_text()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_sigterm_reaches_the_copy_and_a_sigkill_leaves_nothing_running(server, project):
    """A stage waiting for a lock another run holds (a real `curio stage annotate-text`): SIGTERM to the command
    stops the copy (exit 143, as without the server); SIGKILL of the command kills the copy."""
    path, log = server
    env = warm(path)
    holder = test_locks.start_holder(project)  # a real stage that holds its outputs' lock
    try:
        for sig, expected in ((signal.SIGTERM, 143), (signal.SIGKILL, -signal.SIGKILL)):
            before = len(copies(log))
            cmd = subprocess.Popen([CURIO, "stage", "annotate-text", "--wait", "-S", "runner.grace_s=5"], cwd=project,
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            deadline = time.time() + 120
            while len(copies(log)) == before:
                assert cmd.poll() is None, cmd.communicate()
                assert time.time() < deadline, "the command never reached the server"
                time.sleep(0.1)
            copy = copies(log)[-1]
            time.sleep(2)  # it waits for the holder's lock
            assert alive(copy) and cmd.poll() is None
            assert os.readlink(f"/proc/{copy}/cwd") == str(project)
            cmd.send_signal(sig)
            rc = cmd.wait(timeout=60)
            _, err = cmd.communicate()
            assert rc == expected, err
            if sig == signal.SIGTERM:
                assert "waiting for" in err and "stopped by SIGTERM" in err, err
            deadline = time.time() + 10
            while alive(copy):
                assert time.time() < deadline, f"the copy {copy} outlived its command"
                time.sleep(0.1)
    finally:
        (project / "release").touch()
        holder.wait(timeout=600)


def test_make_run_serves_the_stages_curio_commands(tmp_path):
    """`python -m pipeline.orchestration.run_dvc`: the server starts, DVC's `curio` command (started while the server
    loads) runs in a copy, the server stops. From a shell whose virtualenv is activated (its prompt exported), with bash
    as $SHELL, which DVC runs the command with (bash drops the prompt: the command still runs in a copy)."""
    stages = {"params": {"cmd": "curio params -S seed=9 > out/params.json", "outs": ["out/params.json"]}}
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["tracking"]["enabled"] = False
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    (tmp_path / "out").mkdir()
    env = base_env(SHELL="/bin/bash", PS1="(.venv) $ ", PS2="> ", PS4="+++ ")
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"]):
        subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True, env=env)
    res = subprocess.run([sys.executable, "-m", "pipeline.orchestration.run_dvc"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "curio: warm start: `curio params -S seed=9` runs in a copy" in res.stderr, res.stderr
    assert '"seed": 9' in (tmp_path / "out/params.json").read_text()
    leftover = subprocess.run(["pgrep", "-f", "pipeline.stage_server"], capture_output=True, text=True).stdout.split()
    assert not [pid for pid in leftover if Path(f"/proc/{pid}/cwd").exists()
                and os.readlink(f"/proc/{pid}/cwd") == str(tmp_path)]
    off = subprocess.run([sys.executable, "-m", "pipeline.orchestration.run_dvc", "-f", "-s", "params"], cwd=tmp_path,
                         env={**env, "CURIO_WARM": "0"}, capture_output=True, text=True, timeout=600)
    assert off.returncode == 0 and "warm start" not in off.stderr, off.stderr
    assert '"seed": 9' in (tmp_path / "out/params.json").read_text()


def session_members(sid: int) -> list[int]:
    """The live processes of session ``sid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[3]) == sid:
                members.append(int(entry.name))
    return members


def test_sigterm_to_make_run_stops_the_stage_in_its_copy_and_leaves_nothing_running(project):
    """`kill MAKE_RUN_PID`: make run passes SIGTERM to DVC, which dies of it; the stage's command gets SIGTERM when
    DVC dies and passes it to its copy, which stops as a stage does (exit 143, its line); the server ends with make
    run, and nothing of the run is left."""
    stages = {"annotate": {"cmd": "curio stage annotate-text --wait -S runner.grace_s=5"}}
    (project / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    env = base_env()
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"]):
        subprocess.run(cmd, cwd=project, check=True, capture_output=True, env=env)
    holder = test_locks.start_holder(project)  # annotate-text's outputs are being written: the stage waits
    err = project / "make-run.err"
    try:
        with open(err, "w") as f:
            run = subprocess.Popen([sys.executable, "-m", "pipeline.orchestration.run_dvc"], cwd=project, env=env,
                                   stderr=f, stdout=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 300
        while not copies(err) or "waiting for" not in err.read_text():
            assert run.poll() is None, err.read_text()
            assert time.time() < deadline, err.read_text()
            time.sleep(0.2)
        copy = copies(err)[-1]
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=60)
        deadline = time.time() + 60
        while session_members(run.pid):
            assert time.time() < deadline, f"left running: {session_members(run.pid)}"
            time.sleep(0.2)
        assert not alive(copy)
        assert "curio: stopped by SIGTERM: annotate-text resumes at" in err.read_text(), err.read_text()
    finally:
        (project / "release").touch()
        holder.wait(timeout=600)


def test_a_command_with_a_closed_standard_stream_runs_itself(server):
    """Nothing to pass for a closed stdin: the command loads everything itself, with the same result."""
    path, log = server
    before = len(copies(log))
    res = subprocess.run([CURIO, "params", "-S", "seed=6"], env=warm(path), capture_output=True, text=True,
                         cwd=REPO, preexec_fn=lambda: os.close(0))
    assert res.returncode == 0 and '"seed": 6' in res.stdout, res.stderr
    assert len(copies(log)) == before
