"""What both tracks' params say the same way of Motif's reward: the count exponent β and the size of the byte-level
reward network (pipeline/models/reward_net.py). No torch here: the params load without it."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

#: Motif's β: a message (a move) repeated in one episode earns r̃ / N^β, N its count in the episode so far.
MOTIF_COUNT_EXPONENT = 3.0

# The network's size fields, the same name, default, bounds and help in every config of a reward network
# (train_reward, train_reward_text, rl_text.oni.model): ``embed_dim: EmbedDim``.
EmbedDim = Annotated[int, Field(16, ge=4, le=512, description="byte embedding size")]
Channels = Annotated[int, Field(32, ge=4, le=1024, description="convolution channels")]
Hidden = Annotated[int, Field(64, ge=4, le=1024, description="hidden units of the head")]
