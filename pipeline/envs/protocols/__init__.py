"""Curio's games through the protocols other trainers speak, thin adapters over one episode loop:

    session.py          one episode at a time of a game over fixed tasks, by the rules of Curio's play
    openenv_server.py   an OpenEnv environment (openenv-core's server classes): ``curio env serve``
    trl_env.py          a class TRL's ``GRPOTrainer(environment_factory=...)`` accepts

The protocol packages are the ``envs`` extra; only ``openenv_server`` imports one (openenv-core), and nothing in the
DAG imports these modules. Which tasks a group serves (the DAG's splits) is decided above the games layer:
``pipeline/tools/game_envs.py``.
"""
