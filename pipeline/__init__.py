"""Curio: train agents from LLM feedback as one reproducible, resumable pipeline."""

__version__ = "0.1.0"
