"""A mistyped params key or stage name gets the close names ("did you mean"), and only close ones."""

from __future__ import annotations

import pytest
from conftest import REPO, curio

from pipeline.core.config import ConfigError
from pipeline.core.suggest import did_you_mean
from pipeline.params import load_params


@pytest.mark.parametrize(("override", "message"), [
    ("games.max_eval_task=8", "params: games.max_eval_task: unknown key (did you mean 'games.max_eval_tasks'?)"),
    ("evalute_text.policies=[base]", "params: evalute_text: unknown key (did you mean 'evaluate_text'?)"),
    ("games.zzz=1", "params: games.zzz: unknown key"),  # nothing close: no guess
])
def test_an_unknown_key_names_the_close_ones(override, message):
    with pytest.raises(ConfigError) as e:
        load_params(REPO / "params.yaml", [override])
    assert str(e.value) == message


def test_an_unknown_stage_names_the_close_one(tmp_path):
    assert did_you_mean("evalute-text", ["evaluate-text", "evaluate-nethack", "rollout-text"]) == \
        " (did you mean 'evaluate-text'?)"
    res = curio(["stage", "evalute-text"], cwd=REPO, check=False)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [res.stderr.strip()]  # one line
    assert res.stderr.startswith("curio: unknown stage 'evalute-text' (did you mean 'evaluate-text'?); known: ")
