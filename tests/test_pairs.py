import random

from stages.pairs import build, effective_success, split_task


def traj(sample, success, turns, judge="VALID", invalid=False):
    conv = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": f"a{sample}"}, {"role": "user", "content": "r"}]
    return {"group": "g", "task_id": "t", "sample": sample, "success": success, "turns": turns,
            "judge_label": judge, "invalid": invalid, "conversation": conv}


def test_chosen_within_threshold_rejected_worse_or_failed():
    rows = [traj(0, True, 5), traj(1, True, 6), traj(2, True, 9), traj(3, False, 20), traj(4, True, 7)]
    chosen, rejected = split_task(rows, threshold=2, strategy="as_failure")
    assert [r["sample"] for r in chosen] == [0, 1, 4]  # best 5 → turns ≤ 7
    assert [r["sample"] for r in rejected] == [2, 3]  # 9 > 7, and the failure


def test_judge_label_strategies():
    bad = traj(0, True, 3, judge="NOTVALID")
    assert effective_success(bad, "as_success") is True
    assert effective_success(bad, "as_failure") is False
    assert effective_success(bad, "drop") is None
    assert effective_success(traj(1, True, 3, invalid=True), "as_success") is None


def test_build_pairs_in_trl_conversational_format():
    rows = [traj(0, True, 4), traj(1, False, 20), traj(2, True, 12)]
    pairs, sft = build(rows, threshold=1, strategy="as_failure", pairs_per_task=1, rng=random.Random(0))
    assert len(pairs) == 1 and len(sft) == 1
    p = pairs[0]
    assert p["prompt"] == rows[0]["conversation"][:2]
    assert p["chosen"] == [{"role": "assistant", "content": "a0"}, {"role": "user", "content": "r"}]
    assert p["rejected"][0]["content"] in {"a1", "a2"}


def test_no_pair_without_a_success_or_without_a_worse_one():
    assert build([traj(0, False, 20)], 2, "as_failure", 1, random.Random(0))[0] == []
    assert build([traj(0, True, 4), traj(1, True, 5)], 2, "as_failure", 1, random.Random(0))[0] == []


def test_filtered_bc_keeps_best_fraction_and_skips_invalid():
    from stages.rl.filtered_bc import top_fraction

    rows = [traj(0, False, 20), traj(1, True, 9), traj(2, True, 4), traj(3, True, 6, invalid=True)]
    assert [r["sample"] for r in top_fraction(rows, 0.5)] == [2, 1]
    assert [r["sample"] for r in top_fraction(rows, 0.01)] == [2]
    assert top_fraction([traj(0, False, 3, invalid=True)], 0.5) == []
