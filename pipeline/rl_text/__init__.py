"""The rl-text stage's algorithms (stages/rl_text.py picks one by ``rl_text.algorithm``): Online Filtered BC, ArCHer,
Online CHAI and GRPO, and what they share (rounds.py: the stage's name and params, each round's tasks)."""
