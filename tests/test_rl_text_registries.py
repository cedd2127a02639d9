"""rl-text's registries: each ``rl_text.algorithm`` and ``rl_text.reward`` the params schema allows has an
implementation (a value added to the schema without one fails here), and a name without one is a one-line error."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.core.config import ConfigError
from pipeline.params import Params, load_params
from pipeline.text.turn_rewards import TURN_REWARDS, make_turn_rewards
from stages.rl_text import ALGORITHMS, run

REPO = Path(__file__).resolve().parents[1]


def allowed(key: str) -> set[str]:
    """The values the params schema (the one params.yaml is generated from) allows for ``rl_text.KEY``."""
    schema = Params.model_json_schema()
    return set(schema["$defs"]["RLTextConfig"]["properties"][key]["enum"])


def test_every_algorithm_the_schema_allows_has_a_module_that_runs_it():
    assert allowed("algorithm") == set(ALGORITHMS) == {"filtered_bc", "archer", "chai", "grpo"}
    for name, module in ALGORITHMS.items():
        assert callable(module.run), name
        assert isinstance(module.OUTPUTS, frozenset) and module.OUTPUTS and "model" not in module.OUTPUTS, name
    assert ALGORITHMS["chai"].OUTPUTS == ALGORITHMS["archer"].OUTPUTS  # the same loop writes them
    assert not ALGORITHMS["filtered_bc"].OUTPUTS & ALGORITHMS["archer"].OUTPUTS


def test_every_reward_the_schema_allows_has_an_implementation():
    assert allowed("reward") == set(TURN_REWARDS) == {"outcome", "judge", "motif", "oni", "infogain"}
    assert TURN_REWARDS["outcome"] is None  # the game's reward, read by each algorithm
    assert all(callable(TURN_REWARDS[name]) for name in ("judge", "motif", "oni", "infogain"))
    params = load_params(REPO / "params.yaml", ["rl_text.reward=outcome"])
    assert make_turn_rewards(params, "key") is None


def test_a_name_without_an_implementation_is_one_line():
    for key in ("algorithm", "reward"):
        with pytest.raises(ConfigError) as e:
            load_params(REPO / "params.yaml", [f"rl_text.{key}=nope"])
        assert "rl_text." + key in str(e.value)
    unknown = SimpleNamespace(rl_text=SimpleNamespace(algorithm="nope", reward="nope"))  # past the schema
    with pytest.raises(ConfigError) as e:
        run(unknown, None)
    assert str(e.value) == "rl_text.algorithm: no algorithm named 'nope'; known: filtered_bc, archer, chai, grpo"
    with pytest.raises(ConfigError) as e:
        make_turn_rewards(unknown, "key")
    assert str(e.value) == "rl_text.reward: no turn reward named 'nope'; known: outcome, judge, motif, oni, infogain"
