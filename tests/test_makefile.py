"""The Makefile's torch wheel is a choice it states (TORCH_INDEX), not one borrowed from a machine's pip
configuration: by default PyTorch's CPU index, empty for PyPI's own wheel, or any index the user names."""

from __future__ import annotations

import subprocess

import pytest
from conftest import REPO

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def torch_install_line(*args: str) -> str:
    """The pip line `make install` runs to install torch in a fresh venv (make -n: printed, not run)."""
    out = subprocess.run(["make", "-n", "-W", "pyproject.toml", ".venv/.installed", *args], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    [line] = [line for line in out.splitlines() if "pip install" in line and "torch==" in line]
    return line


@pytest.mark.parametrize(("args", "index"), [((), CPU_INDEX), (("TORCH_INDEX=",), None),
                                             (("TORCH_INDEX=https://mirror.example/simple",),
                                              "https://mirror.example/simple")])
def test_the_torch_wheel_comes_from_the_index_torch_index_names(args, index):
    line = torch_install_line(*args)
    if index is None:
        assert "--extra-index-url" not in line and "--index-url" not in line
    else:
        assert f"--extra-index-url {index} --retries 1 torch==2.13.0" in line
