"""Curio's games as TRL environments: TRL's own GRPOTrainer, with ``environment_factory``, trains on twenty questions
and the environment owns the reward (pipeline/envs/protocols/trl_env.py, pipeline/tools/game_envs.py)."""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from pipeline.envs import make_game
from pipeline.envs.protocols.trl_env import TOOL_NOTE, GameToolEnv
from pipeline.tools import ToolError
from pipeline.tools.game_envs import trl_environment


def test_the_environment_plays_by_the_tool_and_scores_as_the_dag():
    game = make_game("twenty_questions")
    tasks = game.tasks("train")[:2]  # dog, cat
    env = GameToolEnv.factory(game, tasks)()
    opening = env.reset(task_index=1)
    assert opening.startswith(game.system_prompt(tasks[1])) and opening.endswith(TOOL_NOTE)
    assert game.first_message(tasks[1]) in opening
    assert env.get_reward() == -game.max_turns  # nothing played yet: lost at the turn limit
    assert env.move("Is it a dog?") == "No."
    assert env.get_reward() == -game.max_turns  # unfinished still counts as lost
    assert env.move("Is it a cat?") == "Goal reached" and env.success
    assert env.get_reward() == -1.0  # the DAG's outcome reward: -1 for the first move, 0 for the winning one
    with pytest.raises(ValueError, match="over"):
        env.move("Is it a cow?")  # TRL hands the error back to the model as the tool's result
    env.reset(task_index=0)
    assert env.turns == 0 and env.get_reward() == -game.max_turns and env.task.task_id == tasks[0].task_id


def test_the_dataset_rows_are_the_dags_tasks_of_the_split():
    """One row per task of the split as the DAG carves it (train and val disjoint), each an empty prompt that reset
    fills with the task's opening."""
    overrides = ["games.val_fraction=0.25"]
    played = {}
    for split in ("train", "val"):
        factory, dataset = trl_environment("twenty_questions", split=split, overrides=overrides)
        env = factory()
        assert all(row == [{"role": "user", "content": ""}] for row in dataset["prompt"])
        played[split] = []
        for i in dataset["task_index"]:
            env.reset(task_index=i)
            played[split].append(env.task.task_id)
    train_ids = [t.task_id for t in make_game("twenty_questions").tasks("train")]
    assert len(played["val"]) == round(0.25 * len(train_ids))
    assert sorted(played["train"] + played["val"]) == sorted(train_ids)  # train and val: disjoint, all of train
    with pytest.raises(ToolError, match="unknown game group"):
        trl_environment("twenty_question")


def tool_calling_tiny_model(openings: list[str], moves: list[str], tools: list):
    """A tiny GPT-2 with a byte-level BPE trained on the games' text, TRL's Qwen2.5 chat template (it renders tools,
    and TRL knows how to parse its tool calls), taught for a few steps to answer each opening with a call of the
    ``move`` tool, one of ``moves`` at random."""
    import torch
    from trl.chat_template_utils import qwen2_5_chat_template

    from pipeline.models.tiny import build_model, train_tokenizer

    calls = [f"<tool_call>\n{json.dumps({'name': 'move', 'arguments': {'answer': m}})}\n</tool_call>" for m in moves]
    tok = train_tokenizer(openings + calls * 4 + ["Yes.", "No.", "Goal reached"], vocab_size=600)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = qwen2_5_chat_template
    model = build_model(tok, n_layer=2, n_embd=64, n_head=2, n_positions=1024)
    rows = []
    for opening in openings:
        prompt = tok.apply_chat_template([{"role": "user", "content": opening}], tools=tools,
                                         add_generation_prompt=True, tokenize=True, return_dict=False)
        rows += [(prompt, tok(c + "<|im_end|>", add_special_tokens=False)["input_ids"]) for c in calls]
    n = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), n), tok.pad_token_id)
    labels, mask = torch.full((len(rows), n), -100), torch.zeros((len(rows), n), dtype=torch.long)
    for i, (p, c) in enumerate(rows):
        ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        labels[i, len(p):len(p) + len(c)] = torch.tensor(c)
        mask[i, :len(p) + len(c)] = 1
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(40):
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    return model, tok


def test_trls_grpo_trainer_takes_two_steps_with_the_environment_owning_the_reward(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    factory, dataset = trl_environment("twenty_questions", params_file=str(REPO / "params.yaml"))
    dataset = dataset.select(range(2))  # dog, cat
    probe = factory()
    openings = [probe.reset(task_index=i) for i in dataset["task_index"]]
    model, tok = tool_calling_tiny_model(openings, ["Is it a dog?", "Is it a cat?"], [probe.move])
    before = [p.detach().clone() for p in model.parameters()]
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=96, max_tool_calling_iterations=3, logging_steps=1, report_to=[],
                      save_strategy="no", learning_rate=1e-3, use_cpu=True, seed=0, shuffle_dataset=False)
    trainer = GRPOTrainer(model=model, args=args, train_dataset=dataset, environment_factory=factory,
                          processing_class=tok)  # no reward_funcs: the environment's get_reward is the reward
    trainer.train()

    assert trainer.state.global_step == 2
    steps = [h for h in trainer.state.log_history if "rewards/GameToolEnv/mean" in h]
    assert len(steps) == 2
    assert trainer.reward_func_names == ["GameToolEnv"]  # the environment is the only reward source
    # the last batch's environments are the pool TRL keeps: their returns are the reward TRL logged
    envs = trainer._environment_pool[None]
    assert len(envs) == 4 and any(e.turns > 0 for e in envs)  # the model's tool calls reached the game
    returns = [e.get_reward() for e in envs]
    assert steps[-1]["rewards/GameToolEnv/mean"] == pytest.approx(sum(returns) / len(returns))
    assert all(r == -20.0 or (e.success and r == -(e.turns - 1)) for e, r in zip(envs, returns, strict=True))
    assert any(h["reward_std"] > 0 for h in steps)  # won and lost rollouts of one task: an advantage to learn from
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_nothing_here_imports_trl():
    """The environment class needs no TRL: it only has to look the way TRL reads it."""
    import subprocess
    import sys

    code = "import sys, pipeline.envs.protocols.trl_env; print('trl' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
