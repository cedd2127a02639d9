"""One module per stage kind: inputs, algorithm, outputs. See pipeline/stage.py for the contract."""
