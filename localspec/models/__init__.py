"""Models: named models and pairs (models.toml), their sources and local files, GGUF headers, and
whether a model is base or instruct."""
