"""Online RL stages: filtered BC for the text track, APPO for NetHack."""
