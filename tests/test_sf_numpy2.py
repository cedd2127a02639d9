"""sample-factory 2.1.1 on NumPy 2: the rollout worker's per-step writes (sf_compat.py says why they broke), and a
real asynchronous training with two rollout worker processes that collects its steps instead of hanging at 0 FPS."""

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from sample_factory.algo.utils.tensor_dict import TensorDict

from pipeline.nethack import sf  # noqa: F401  (importing it applies the patch, as in sample-factory's workers)
from pipeline.nethack.sf import latest_checkpoint


def step_outputs() -> dict:
    """One env's policy outputs for one step, as the rollout worker splits them: length-1 arrays for scalars."""
    return {"actions": np.array([2]), "log_prob_actions": np.array([-0.5], dtype=np.float32),
            "action_logits": np.array([0.1, 0.2, 0.3], dtype=np.float32), "values": np.array([1.5], dtype=np.float32)}


def test_numpy_refuses_a_length_one_array_in_a_scalar_slot():
    """The NumPy behaviour behind the crash: an error from 2.4 on, a deprecation before it."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with pytest.raises((TypeError, ValueError)):
            np.zeros(4)[1] = np.array([2.0])


def test_a_trajectory_buffer_takes_one_steps_outputs():
    buffer = TensorDict({"actions": np.zeros(4, dtype=np.int64), "log_prob_actions": np.zeros(4, dtype=np.float32),
                         "action_logits": np.zeros((4, 3), dtype=np.float32), "values": np.zeros(4, dtype=np.float32),
                         "on_torch": torch.zeros(4, 2)})
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # no implicit conversion left, on any NumPy 2
        buffer[1] = {**step_outputs(), "on_torch": np.array([3.0, 4.0], dtype=np.float32)}
        buffer[2] = {"actions": torch.tensor([1]), "values": torch.tensor([0.25])}  # tensors too, as before
    assert buffer["actions"].tolist() == [0, 2, 1, 0]
    assert buffer["log_prob_actions"][1] == pytest.approx(-0.5)
    assert buffer["action_logits"][1].tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert buffer["values"].tolist() == [0.0, 1.5, 0.25, 0.0]
    assert buffer["on_torch"][1].tolist() == [3.0, 4.0]
    with pytest.raises(ValueError):  # a real shape mismatch still fails, as sample-factory's own code does
        buffer[3] = {"action_logits": np.array([1.0, 2.0], dtype=np.float32)}


def test_asynchronous_training_with_two_rollout_workers_collects_steps(tmp_path):
    """The symptom itself: before the patch, both workers died on their first step and the learner waited forever."""
    args = ["--experiment=async", f"--train_dir={tmp_path}", "--seed=0", "--nethack_task=score",
            "--nethack_max_episode_steps=200", "--serial_mode=False", "--async_rl=True", "--num_workers=2",
            "--num_envs_per_worker=4", "--worker_num_splits=2", "--batch_size=256", "--rollout=32",
            "--use_rnn=False", "--intrinsic_reward=none", "--train_for_env_steps=2048", "--save_every_sec=5"]
    res = subprocess.run([sys.executable, "-m", "pipeline.nethack", *args], capture_output=True, text=True,
                         timeout=240)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-3000:]
    assert "unhandled exception" not in log, log[-3000:]
    found = latest_checkpoint(tmp_path / "async")
    assert found is not None and found[1] >= 2048
