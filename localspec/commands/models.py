"""`localspec models`: the models and pairs localspec knows, and which are already local."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from localspec.drafter_spec import DrafterSpec
from localspec.models.kind import ModelKind
from localspec.models.registry import Registry, load_registry


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "models",
        help="list known models and pairs, and which are on disk",
        description="List the models and pairs of models.toml (the packaged file and your own) "
        "and whether each is usable without a download.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (default: tables)")
    parser.set_defaults(func=handler)


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


def _kind(kind: str | None) -> str:
    return kind if kind and kind != "unknown" else "-"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _pair_local(registry: Registry, target: str, drafter: DrafterSpec) -> bool:
    draft_ok = drafter.path is None or registry.is_local(drafter.path)
    return registry.is_local(target) and draft_ok


def listing(registry: Registry) -> dict[str, Any]:
    """Everything `localspec models` shows, as plain data."""
    models = [
        {"name": m.name, "source": str(m.source), "description": m.description,
         "local": registry.is_local(m.name), "kind": m.kind or None,
         "instruct": m.instruct or None}
        for m in registry.models.values()
    ]
    pairs = [
        {"name": p.name, "target": p.target, "drafter": str(p.drafter), "draft_max": p.draft_max,
         "n_ctx": p.n_ctx, "temperature": p.temperature, "default": p.name == registry.default_pair,
         "kind": registry.kind_of(p.target).kind,
         "local": _pair_local(registry, p.target, p.drafter), "description": p.description}
        for p in registry.pairs.values()
    ]
    return {"files": list(registry.files), "default_pair": registry.default_pair,
            "pairs": pairs, "models": models}


def handler(args: argparse.Namespace) -> int:
    data = listing(load_registry())
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    pair_rows = [(p["name"] + (" (default)" if p["default"] else ""), p["target"],
                  _kind(p["kind"]), p["drafter"], _yes(p["local"])) for p in data["pairs"]]
    model_rows = [(m["name"], _kind(m["kind"]), _yes(m["local"]), m["source"])
                  for m in data["models"]]
    print(_table(("PAIR", "TARGET", "KIND", "DRAFTER", "LOCAL"), pair_rows))
    print()
    print(_table(("MODEL", "KIND", "LOCAL", "SOURCE"), model_rows))
    print()
    for model in data["models"]:
        if model["kind"] == "base":
            print(f"{model['name']} is {ModelKind('base', model['instruct'] or '').advice()}.")
    print("from " + ", ".join(data["files"]) + "; `localspec pull NAME` downloads a model or pair.")
    return 0
