"""One module per stage kind: inputs, algorithm, outputs. See pipeline/core/stage.py for the contract."""
