"""The text track's domain: playing games (play, scripted players, policies), judging them, the curriculum,
multi-turn preference pairs and their reward, and leave-one-game-out evaluation."""
