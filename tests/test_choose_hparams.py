"""`curio choose hparams` (pipeline/tools/choose_hparams.py) retrains a stage in a scratch tree linked to a finished
run's data/: everything the stage and its downstream stages write must be real directories there, never links into
the finished run."""

import pytest

from pipeline.tools import ToolError
from pipeline.tools.choose_hparams import chain, link_upstream, remade


def test_retraining_dpo_remakes_its_margins_and_links_only_what_comes_before(tmp_path):
    run = tmp_path / "run"
    for d in ("rollout_text", "pairs_text/sft", "reflogprobs", "train_policy/sft", "train_policy/dpo",
              "train_policy/dpo_margins", "rl_text", "evaluate_text"):
        (run / d).mkdir(parents=True)
        (run / d / "part-0.parquet").write_text(d)
    scratch = tmp_path / "scratch"
    link_upstream(run, scratch, remade("train-dpo"))

    for d in ("rollout_text", "pairs_text", "reflogprobs", "train_policy/sft"):
        assert (scratch / d).is_symlink() and (scratch / d).resolve() == (run / d).resolve()
    assert (scratch / "train_policy").is_dir() and not (scratch / "train_policy").is_symlink()
    for d in ("train_policy/dpo", "train_policy/dpo_margins", "rl_text", "evaluate_text"):
        assert not (scratch / d).exists(), d  # the stage writes them anew, never into the finished run


def test_the_scratch_tree_takes_output_locks_of_its_own(tmp_path):
    """A stage still writing in the finished run (its lock held there) never blocks the scratch tree's stages."""
    from pipeline.core.locks import hold

    run = tmp_path / "run"
    (run / "train_policy" / "dpo").mkdir(parents=True)
    scratch = tmp_path / "scratch"
    with hold(run, ["rl_text"], "rl-text"):
        link_upstream(run, scratch, remade("rl-text"))
        assert not (scratch / ".locks").exists()
        with hold(scratch, ["rl_text"], "rl-text", wait=False):  # refused (Busy) if the run's lock were shared
            pass


def test_what_each_stage_remakes_follows_dvc_yaml():
    assert set(remade("train-sft")) >= {"train_policy/sft", "reflogprobs", "train_policy/dpo",
                                   "train_policy/dpo_margins", "rl_text", "evaluate_text"}
    assert "train_policy/sft" not in remade("train-dpo") and "reflogprobs" not in remade("train-dpo")
    assert "train_policy/dpo_margins" in remade("train-dpo")
    assert set(remade("rl-text")) >= {"rl_text", "evaluate_text"} and "train_policy/dpo" not in remade("rl-text")


def test_a_chain_runs_the_stages_between_two_in_the_dags_order():
    assert chain("pairs-text", "train-dpo") == ["pairs-text", "train-sft", "reflogprobs", "train-dpo"]
    assert chain("train-sft", "train-sft") == ["train-sft"]
    assert chain("train-dpo", "rl-text") == ["train-dpo", "rl-text"]
    with pytest.raises(ToolError, match="not downstream"):
        chain("train-dpo", "train-sft")
