"""The Motif message reward model of the NetHack track: the shared byte-level text reward network
(``pipeline.models.reward_net``) over message captions, trained by train-reward on caption preferences."""

from pipeline.models.reward_net import (
    CONFIG,
    STATS,
    WEIGHTS,
    MessageRewardNet,
    RewardNetConfig,
    RewardStats,
    encode_texts,
    load_reward_model,
    save_reward_model,
    soft_bt_loss,
)

__all__ = ["CONFIG", "STATS", "WEIGHTS", "MessageRewardNet", "RewardNetConfig", "RewardStats", "encode_texts",
           "load_reward_model", "save_reward_model", "soft_bt_loss"]
