"""Sampled rows under a JSON schema: tokens/s at temperature 0.8 beside greedy (docs/measurements/
grammar-isolation.md, "Sampled rows"). The embedded Gemma, n-gram drafts, 2 threads, 64 tokens,
seed 1, each arm twice in turns (the first greedy run includes warming up).

    python benchmarks/grammar_sampling.py [--target GGUF]
"""

from __future__ import annotations

import argparse

from localspec.models.registry import load_registry
from localspec.runtime.engine import Engine
from localspec.text.grammar import json_schema_to_gbnf
from localspec.types import GenerationParams

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"]}
PROMPT = "Describe a fictional person as JSON with a name, an age and tags:"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", help="target GGUF (default: the default pair's)")
    args = parser.parse_args()
    target = args.target or str(load_registry().resolve_pair().target)
    grammar = json_schema_to_gbnf(SCHEMA)
    with Engine.load(target, draft="ngram", n_threads=2) as engine:
        for temperature in (0.0, 0.8, 0.0, 0.8):
            params = GenerationParams(temperature=temperature, max_tokens=64, grammar=grammar)
            result = engine.generate(PROMPT, params, seed=1)
            text = engine.detokenize(result.tokens)
            print(f"temperature {temperature}: {result.stats.n_tokens} tokens, "
                  f"{result.stats.tokens_per_second:.1f} tokens/s  {text[:60]!r}")


if __name__ == "__main__":
    main()
