import subprocess
import sys

import pytest

from pipeline.core.config import ConfigError
from pipeline.params import load_params


def test_default_params_validate():
    p = load_params("params.yaml")
    assert p.policy.model == "builtin" and p.train_policy.dpo.beta == 0.1


@pytest.mark.parametrize(
    "override, key",
    [
        ("rollout_text.bogus=1", "rollout_text.bogus: unknown key"),
        ("rollout_text.temperature=hot", "rollout_text.temperature"),
        ("train_policy.dpo.beta=-1", "train_policy.dpo.beta"),
        ("pairs_text.judge_label_strategy=maybe", "pairs_text.judge_label_strategy"),
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        load_params("params.yaml", [override])
    assert key in str(e.value) and "\n" not in str(e.value)


def test_override_types_are_parsed():
    p = load_params("params.yaml", ["rollout_text.temperature=0.5", "games.groups=[twenty_questions]"])
    assert p.rollout_text.temperature == 0.5 and p.games.groups == ["twenty_questions"]


def test_cli_exits_2_with_one_line_and_writes_nothing(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "stage", "pairs-text", "-S",
                          f"data_dir={tmp_path}/d", "-S", "pairs_text.turn_threshold=-3"],
                         capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "pairs_text.turn_threshold" in res.stderr
    assert not (tmp_path / "d").exists()


def test_embedded_defaults_equal_params_yaml():
    """The pydantic defaults are the shipped params.yaml: a section left out of params.yaml means the same run."""
    from pipeline.params import Params

    assert Params().model_dump(mode="json") == load_params("params.yaml").model_dump(mode="json")
