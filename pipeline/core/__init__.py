"""The machinery every stage stands on: storage (artifacts), params loading, the stage contract, runners, tracking,
checkpoints and errors. It imports nothing else of the project."""
