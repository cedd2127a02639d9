"""The NetHack track's shared pieces: Motif captions, the intrinsic reward and the sample-factory integration."""
