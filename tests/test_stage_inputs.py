"""Every stage, with each input it reads missing in turn, fails at once: exit 2, one line naming the stage to run
first, nothing written — for the built-in policy and for a real ``policy.model`` alike.

The inputs come from the stage declarations (``Stage.data``, narrowed by ``Stage.needs`` to what a run with these
params reads); every other declared input is present (an empty placeholder: the check comes before any work, so
it is never read). CLI cases run in-process (typer's CliRunner on ``pipeline.cli.app``), as in test_bad_inputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pipeline import cli
from pipeline.core.artifacts import producing_stage
from pipeline.core.registry import STAGES
from pipeline.core.stage import declaration
from pipeline.params import load_params

REPO = Path(__file__).resolve().parents[1]
POLICIES = ["builtin", "real"]

#: Declared inputs a run with the default params does not read (so their absence is no error): each says why.
UNREAD_BY_DEFAULT = {
    ("pairs-text", "data/bootstrap"): "the base policy continues conversations only for pairs_text.strategy: "
                                      "multiturn",
    ("reflogprobs", "data/bootstrap"): "the reference policy is train_policy.dpo.init (sft by default; the "
                                       "bootstrap model only when it is base)",
    ("train-dpo", "data/bootstrap"): "DPO starts from train_policy.dpo.init (sft by default; the bootstrap model "
                                     "only when it is base)",
    ("rl-text", "data/train_policy/sft"): "every RL algorithm starts from the DPO policy (a dep for DVC's order)",
    ("rl-text", "data/reward_model_text"): "only rl_text.reward: motif reads the utterance reward model "
                                           "(tests/test_motif_text.py: its absence then is one line, exit 2)",
}


@pytest.fixture(scope="module")
def real_model(tmp_path_factory) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("real") / "model"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=1, n_embd=8, vocab_size=64, n_positions=32)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def params_file(tmp_path_factory) -> Path:
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["tracking"]["enabled"] = False
    path = tmp_path_factory.mktemp("params") / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def overrides(policy: str, real_model: Path | None) -> list[str]:
    return [f"policy.model={real_model}"] if policy == "real" else []


def cases() -> list[tuple[str, str, str]]:
    """(stage, policy, input) for every stage's declared data input, under both policies (filtered at run time to
    what the run reads)."""
    return [(name, policy, dep) for name in STAGES for policy in POLICIES for dep in declaration(name).data]


CASES = cases()


@pytest.mark.parametrize(("name", "policy", "dep"), CASES, ids=[f"{n}-{p}-{d.removeprefix('data/')}"
                                                               for n, p, d in CASES])
def test_a_missing_input_names_the_stage_to_run(name, policy, dep, real_model, params_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CURIO_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "data"
    sets = [*overrides(policy, real_model), f"data_dir={data}", f"metrics_dir={tmp_path / 'metrics'}"]
    params = load_params(params_file, sets)
    stage = declaration(name)
    needed = stage.needed(stage.slice(params))
    if dep not in needed:
        if policy == "real" and dep == "data/bootstrap":
            pytest.skip("a real policy.model is the base policy itself: data/bootstrap is not read")
        assert (name, dep) in UNREAD_BY_DEFAULT, f"{name} declares {dep} but does not read it: say why"
        pytest.skip(UNREAD_BY_DEFAULT[(name, dep)])
    for other in stage.data:
        if other != dep:
            (data / other.removeprefix("data/")).mkdir(parents=True, exist_ok=True)
    result = CliRunner().invoke(cli.app, ["stage", name, "-p", str(params_file), *(a for s in sets for a in ("-S", s))])
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    writer = producing_stage(dep)
    assert writer is not None
    assert f"run {writer} first" in lines[0] and str(data / dep.removeprefix("data/")) in lines[0], lines[0]
    for out in stage.all_outs():  # failed before any work: none of its outputs was created
        if out.path.startswith("data/"):
            assert not (data / out.path.removeprefix("data/")).exists(), out.path


def test_every_unread_input_is_declared():
    for name, dep in UNREAD_BY_DEFAULT:
        assert dep in declaration(name).data
