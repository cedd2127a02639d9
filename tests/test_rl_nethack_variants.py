"""rl-nethack trains its variants side by side: one core each, up to twice the machine's cores."""

from pipeline.params import Params
from stages.rl.appo import concurrent_variants


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
