"""Models the pipeline trains and loads: the built-in tiny LM, chat masks and templates, GGUF import, TRL training and
its multi-process launch."""
