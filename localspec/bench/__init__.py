"""Benchmarks: plain vs speculative decoding on the same prompts, in one process (docs/design.md,
"Benchmarks")."""
