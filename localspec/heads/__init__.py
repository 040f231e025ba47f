"""EAGLE-3 heads as files: the eagle3 GGUF layout, a checkpoint's config.json, and converting a
Hugging Face checkpoint into that GGUF."""
