"""Motif captions: consecutive identical messages grouped as ``msg (xN)``, empty ones dropped."""

from __future__ import annotations

import numpy as np

from pipeline.nethack.captions import caption, group_messages, window_captions


def test_consecutive_identical_messages_are_grouped_with_a_count():
    assert group_messages(["It's a wall.", "It's a wall.", "It's a wall.", "You kill the newt!"]) == [
        "It's a wall. (x3)",
        "You kill the newt!",
    ]


def test_a_single_message_has_no_count():
    assert caption(["You see here a dagger."]) == "You see here a dagger."


def test_empty_messages_are_dropped():
    assert group_messages(["", "  ", "You hear some noises.", ""]) == ["You hear some noises."]
    assert caption(["", ""]) == ""
    assert caption([]) == ""


def test_an_empty_step_does_not_split_a_run_but_another_message_does():
    assert caption(["Ouch!", "", "Ouch!"]) == "Ouch! (x2)"
    assert caption(["Ouch!", "Never mind.", "Ouch!"]) == "Ouch!\nNever mind.\nOuch!"


def test_window_captions_stop_at_the_episode_start():
    messages = ["a", "a", "b", "x", "", "x"]
    episodes = np.array([0, 0, 0, 1, 1, 1])
    assert window_captions(messages, episodes, np.array([2, 3, 5]), window=3) == ["a (x2)\nb", "x", "x (x2)"]
    assert window_captions(messages, episodes, np.array([4, 0]), window=1) == ["", "a"]
