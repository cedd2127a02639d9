"""The NetHack track in one package, as sample-factory keeps ``sf_examples/nethack/``.

- ``env``: the Motif / ONI tasks on NLE; ``play``: random and trained-policy episodes (rollouts, evaluation).
- ``captions``: the text an annotator reads; ``annotation`` + ``prompts/``: Motif preferences and ONI labels.
- ``reward``: the message reward model (Bradley-Terry on caption pairs); ``intrinsic``: the per-step reward
  it gives the agent; ``oni``: the online annotator and reward types.
- ``sf``: the sample-factory integration (env registration, encoder, ONI observer); ``python -m pipeline.nethack``.
"""
