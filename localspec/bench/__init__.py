"""Benchmarks: plain vs speculative decoding on the same prompts, in one process (DESIGN §7)."""
