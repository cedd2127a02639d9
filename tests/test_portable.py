"""``reproducible: portable``: the same bytes whatever instruction sets the CPU offers beyond AVX2.

On one machine the test stands in for two: a process whose kernels may use AVX-512 (where the CPU has it) and one
capped at AVX2 from outside, as on an AVX2-only machine. A native run differs between the two (else this CPU cannot
tell them apart and the test is skipped); a portable run gives the same model in both.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, curio

sys.path.insert(0, str(Path(__file__).parent))
import test_warm_start  # noqa: E402
from test_warm_start import CURIO, copies, warm  # noqa: E402

server = test_warm_start.server  # the fixture: a warm start's server, native

from pipeline.core.artifacts import dir_hash  # noqa: E402
from pipeline.core.config import ConfigError  # noqa: E402
from pipeline.core.kernels import PORTABLE_ENV, kernel_env, require, settle  # noqa: E402

# bootstrap, small enough for seconds and large enough that its kernels' instruction set shows in the weights
TINY_BOOTSTRAP = [
    "tracking.enabled=false", "games.groups=[wordle]", "bootstrap.episodes=40", "bootstrap.n_layer=2",
    "bootstrap.n_embd=64", "bootstrap.n_head=2", "bootstrap.vocab_size=300", "bootstrap.epochs=1",
]
CAPPED = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
UNCAPPED = dict.fromkeys(PORTABLE_ENV, "")  # empty: each library's default (the CPU's own instruction set)


def bootstrap(tmp_path, name: str, env: dict[str, str], *overrides: str) -> str:
    """``curio stage bootstrap`` in a process of its own with ``env``; the hash of the model it trained."""
    root = tmp_path / name
    root.mkdir()
    (root / "params.yaml").write_text((REPO / "params.yaml").read_text())
    args = [f"-S{o}" for o in [*TINY_BOOTSTRAP, f"data_dir={root / 'data'}", *overrides]]
    curio(["stage", "bootstrap", *args], root, env=env)
    return dir_hash(root / "data" / "bootstrap" / "model")


def test_a_portable_run_gives_the_same_model_with_its_kernels_capped_at_avx2_or_not(tmp_path):
    native = bootstrap(tmp_path, "native", UNCAPPED)
    if bootstrap(tmp_path, "native-avx2", CAPPED) == native:
        pytest.skip("this CPU's own kernels give what AVX2's give: nothing to tell apart here")
    portable = bootstrap(tmp_path, "portable", UNCAPPED, "reproducible=portable")
    assert bootstrap(tmp_path, "portable-avx2", {**CAPPED, "OMP_NUM_THREADS": "3"}, "reproducible=portable") \
        == portable


def test_portable_pins_every_kernel_library_and_the_threads(monkeypatch):
    assert kernel_env("native", None) == {}
    assert kernel_env("native", 4) == {"OMP_NUM_THREADS": "4"}
    portable = kernel_env("portable", None)
    assert portable["ATEN_CPU_CAPABILITY"] == "avx2" and portable["MKL_CBWR"] == "COMPATIBLE"
    assert portable["ONEDNN_MAX_CPU_ISA"] == "AVX2" and portable["OMP_NUM_THREADS"] == "2"
    import torch  # noqa: F401 - this process as a warm start's copy is: torch loaded, so pinning now is too late

    for name in PORTABLE_ENV:
        monkeypatch.delenv(name, raising=False)
    restart = settle("portable", None)
    assert restart is not None and restart["ATEN_CPU_CAPABILITY"] == "avx2"
    assert "ATEN_CPU_CAPABILITY" not in os.environ  # the command starts over: nothing half-set here
    with pytest.raises(ConfigError, match="torch was loaded in this process before its kernels could be pinned"):
        require("portable", None)


def test_a_stage_declares_the_kernel_keys_so_switching_reruns_it():
    dvc = yaml.safe_load((REPO / "dvc.yaml").read_text())
    for name, stage in dvc["stages"].items():
        assert {"reproducible", "threads"} <= set(stage.get("params", [])), name


def test_a_warm_start_of_native_kernels_does_not_run_a_portable_command(server, tmp_path):
    """Under `make run` each stage runs in a copy of a server that loaded torch in its own environment: a portable
    command sent to a native server starts over as a process of its own, and trains what a portable run trains."""
    path, log = server
    served = tmp_path / "served"
    served.mkdir()
    (served / "params.yaml").write_text((REPO / "params.yaml").read_text())
    args = [f"-S{o}" for o in [*TINY_BOOTSTRAP, f"data_dir={served / 'data'}", "reproducible=portable"]]
    before = len(copies(log))
    res = subprocess.run([CURIO, "stage", "bootstrap", *args], env=warm(path), capture_output=True,
                         text=True, cwd=served)
    assert res.returncode == 0, res.stderr[-3000:]
    assert len(copies(log)) == before + 1  # the server took it ...
    assert "curio: reproducible: portable: torch was loaded here with other kernels; starting over" in res.stderr
    assert dir_hash(served / "data" / "bootstrap" / "model") == \
        bootstrap(tmp_path, "direct", UNCAPPED, "reproducible=portable")  # ... and the command ran as its own
