"""rl-nethack trains its variants side by side: one core each, up to twice the machine's cores."""

import pytest

from pipeline.params import Params
from stages.rl_nethack import concurrent_variants


def params(**rl) -> Params:
    return Params.model_validate({"rl_nethack": rl})


def test_serial_variants_take_a_core_each_up_to_twice_the_cores():
    assert concurrent_variants(params(), cores=2) == 3  # the default three variants all at once on 2 cores
    assert concurrent_variants(params(), cores=1) == 2
    four = {f"v{i}": {"ext_coef": 0.1, "int_coef": 0.0} for i in range(8)}
    assert concurrent_variants(params(variants=four), cores=2) == 4


def test_parallel_runners_take_their_workers_cores():
    assert concurrent_variants(params(serial_mode=False, num_workers=2), cores=2) == 1
    assert concurrent_variants(params(serial_mode=False, num_workers=1), cores=8) == 3


def test_a_checkpoint_holding_a_numpy_best_performance_loads_and_other_objects_do_not(tmp_path):
    """A long run's sample-factory checkpoint keeps ``best_performance`` as a numpy float64 (a toy run's stays a Python
    float): evaluate-nethack's weights-only load takes it; any other pickled object is still refused."""
    import fractions
    import pickle

    import numpy as np
    import pytest
    import torch

    from pipeline.nethack.sf import load_checkpoint

    state = {"train_step": 3908, "env_steps": 4001792, "best_performance": np.float64(15.79),
             "model": {"w": torch.ones(2)}, "curr_lr": 3e-4}
    torch.save(state, tmp_path / "checkpoint_000003908_4001792.pth")
    loaded = load_checkpoint(tmp_path / "checkpoint_000003908_4001792.pth")
    assert loaded["best_performance"] == 15.79 and torch.equal(loaded["model"]["w"], torch.ones(2))
    torch.save({**state, "extra": fractions.Fraction(1, 3)}, tmp_path / "other.pth")
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(tmp_path / "other.pth")


FAKE_TRAINER = """
import sys
from pathlib import Path
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
experiment = Path(args["train_dir"]) / args["experiment"]
(experiment / "checkpoint_p0").mkdir(parents=True, exist_ok=True)
(experiment / "checkpoint_p0" / "checkpoint_000000009_{steps}.pth").write_bytes(b"")
(experiment / "curio_summary.json").write_text('{{"env_steps": {steps}}}')
sys.exit(143)  # sample-factory stopped by the stage's SIGTERM, its checkpoint saved
"""


@pytest.mark.parametrize("steps, action", [(4352, "trained"), (2048, "stopped")])
def test_a_variant_the_stop_reached_after_its_last_iteration_is_trained(steps, action, tmp_path, monkeypatch):
    """The stage's SIGTERM reached a variant's trainer after its last iteration (its checkpoint is past the budget):
    it is trained, as the rerun would find it, not stopped "at 4352 of 4096 env steps"; before its budget it is
    stopped where its checkpoint is."""
    import subprocess
    import sys

    import stages.rl_nethack as appo
    from pipeline.core import interrupt

    p = Params.model_validate({"data_dir": str(tmp_path / "data"), "rl_nethack": {
        "train_for_env_steps": 4096, "variants": {"ext": {"ext_coef": 1.0, "int_coef": 0.0, "reward": "none"}}}})
    real, started = subprocess.Popen, []

    def fake(command, **kwargs):
        started.append(command)  # the stop comes while it trains
        return real([sys.executable, "-c", FAKE_TRAINER.format(steps=steps), *command[3:]], **kwargs)

    monkeypatch.setattr(appo.subprocess, "Popen", fake)
    monkeypatch.setattr(interrupt, "requested", lambda: 15 if started else None)
    summary = appo.train_variant(p, "ext", p.rl_nethack.variants["ext"])
    assert summary["action"] == action and summary["env_steps"] == steps
