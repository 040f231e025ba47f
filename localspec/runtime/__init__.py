"""Running models: the engine thread that owns the llama contexts, its loop, request handles,
loading the core with checked arguments, RPC workers and what the controller learned between
runs."""
