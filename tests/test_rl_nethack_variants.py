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
