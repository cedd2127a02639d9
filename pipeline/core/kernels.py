"""The CPU kernels a stage computes with: this CPU's own (``reproducible: native``) or the same on every x86 CPU with
AVX2 (``reproducible: portable``), and how many threads split its float sums (``threads``).

torch's float results on a CPU depend on more than the code: each of its three kernel libraries picks an instruction
set by what the CPU offers, and the order in which a kernel adds up products follows from it.

- ATen (torch's own kernels: softmax, attention, reductions) runs its AVX-512 or its AVX2 build: the CPU capability,
  pinned by ``ATEN_CPU_CAPABILITY``.
- MKL (torch's GEMM on x86: every ``nn.Linear`` and GPT-2 ``Conv1D``, training included) picks its code by CPU
  vendor and cache sizes as well as instruction set: on an AMD CPU with AVX-512 it runs an AVX2 path, on an Intel
  one its AVX-512 path. ``MKL_CBWR=COMPATIBLE`` is its conditional numerical reproducibility mode on the one branch
  Intel documents as giving the same results on Intel and non-Intel CPUs (SSE2 code, fixed cache sizes,
  deterministic reductions, static scheduling); ``MKL_ENABLE_INSTRUCTIONS=AVX2`` caps what it may use besides.
- oneDNN (convolutions, ``policy.cpu_linear: onednn``) picks its kernels by instruction set:
  ``ONEDNN_MAX_CPU_ISA=AVX2``, and float32 math kept float32 (``ONEDNN_DEFAULT_FPMATH_MODE=STRICT``).
- Threads: a sum split over 2 threads adds in another order than over 4, so the thread count is part of the bytes.

The libraries read these variables once, when torch first runs a kernel, so they are set before torch loads:
:func:`settle` sets them in this process's environment (the processes it starts inherit them) and says when it is
too late (torch loaded already, as in a warm start's copy): the ``curio`` command then starts over
(``pipeline.cli``), and :func:`require` (what ``execute`` calls) refuses to run a stage with the wrong kernels.
``native`` leaves the environment as it is: the CPU's own kernels, unless capped from outside.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Literal

from pydantic import Field

from pipeline.core.config import ConfigError

Mode = Literal["native", "portable"]
#: The keys every stage reads besides its declared ones (``Stage`` adds them): they are in its params hash and its
#: dvc.yaml params, so a stage's rows are never a mix of two kinds of kernels and switching reruns it.
KERNEL_KEYS = ("reproducible", "threads")
REPRODUCIBLE = Field(
    "native", description="native: the kernels this CPU runs fastest (results are the same bytes on the same CPU "
    "model, not across vendors or instruction sets); portable: every kernel library pinned to what any x86 CPU with "
    "AVX2 runs the same way, and a fixed thread count, so Intel and AMD machines give the same bytes "
    "(docs/reproducibility.md)")
THREADS = Field(
    None, ge=1, description="torch's threads (MKL's and OpenMP's with them) in every stage process; null: one per "
    "core under native, 2 under portable. A float sum split over another thread count adds in another order")
#: What ``portable`` sets (see the module's docstring).
PORTABLE_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "ONEDNN_DEFAULT_FPMATH_MODE": "STRICT",
}
PORTABLE_THREADS = 2


def kernel_env(mode: Mode, threads: int | None) -> dict[str, str]:
    """The environment variables ``mode`` and ``threads`` set (none for ``native`` without ``threads``)."""
    env = dict(PORTABLE_ENV) if mode == "portable" else {}
    count = threads or (PORTABLE_THREADS if mode == "portable" else None)
    if count:
        env["OMP_NUM_THREADS"] = str(count)
    return env


def _has_avx2(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """Whether this CPU has AVX2 and FMA (None: cannot tell, not Linux)."""
    try:
        flags = next((line.split(":", 1)[1].split() for line in cpuinfo.read_text().splitlines()
                      if line.startswith("flags")), [])
    except OSError:
        return None
    return "avx2" in flags and "fma" in flags


def settle(mode: Mode, threads: int | None) -> dict[str, str] | None:
    """Put this process's environment in ``mode`` (and torch's threads, where torch is loaded). None when done; the
    environment the process must start over with when a kernel variable would change after torch was loaded (the
    libraries may have read it already). Raises ConfigError for ``portable`` on a CPU without AVX2."""
    if mode == "portable" and _has_avx2() is False:
        raise ConfigError("reproducible: portable pins the kernels of x86 CPUs with AVX2 and FMA, which this CPU "
                          "lacks; use reproducible: native")
    wanted = kernel_env(mode, threads)
    changed = {k for k, v in wanted.items() if os.environ.get(k) != v} - {"OMP_NUM_THREADS"}
    if changed and "torch" in sys.modules:
        return {**os.environ, **wanted}
    os.environ.update(wanted)
    if "OMP_NUM_THREADS" in wanted and "torch" in sys.modules:
        import torch

        torch.set_num_threads(int(wanted["OMP_NUM_THREADS"]))
    return None


def require(mode: Mode, threads: int | None) -> None:
    """:func:`settle`, refusing (ConfigError) where torch was loaded with other kernels than ``mode`` asks for."""
    if settle(mode, threads) is not None:
        names = " ".join(f"{k}={v}" for k, v in PORTABLE_ENV.items())
        raise ConfigError(f"reproducible: {mode}: torch was loaded in this process before its kernels could be "
                          f"pinned; run the stage as a process of its own (`curio stage`) or start this one with "
                          f"{names}")
