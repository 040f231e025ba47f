"""Command-line options that shape the target's distribution (penalties, a grammar, a JSON
Schema), shared by ``run`` and ``chat`` (``bench`` takes the penalties). They only convert:
GenerationParams validates."""

from __future__ import annotations

import argparse
from typing import Any

from localspec.errors import InvalidParameterError
from localspec.files import read_input_text
from localspec.text.grammar import json_schema_to_gbnf, load_json_schema
from localspec.types import GenerationParams


def add_shaping_arguments(parser: argparse.ArgumentParser, *, structured: bool = True) -> None:
    """The penalties, and unless ``structured`` is False, --grammar and --json-schema."""
    group = parser.add_argument_group("penalties and structured output" if structured
                                      else "penalties")
    d = GenerationParams()  # the defaults' one owner
    group.add_argument("--repeat-penalty", type=float, default=d.repeat_penalty,
                       help="divide the logits of recent tokens by this "
                       f"(1.0 = off; default: {d.repeat_penalty})")
    group.add_argument("--frequency-penalty", type=float, default=d.frequency_penalty,
                       help="lower recent tokens' logits by this times their count "
                       f"(0 = off; default: {d.frequency_penalty})")
    group.add_argument("--presence-penalty", type=float, default=d.presence_penalty,
                       help="lower the logits of tokens seen recently by this "
                       f"(0 = off; default: {d.presence_penalty})")
    group.add_argument("--repeat-last-n", "--penalty-last-n", dest="penalty_last_n", type=int,
                       default=d.penalty_last_n, help="how many recent tokens the penalties look "
                       f"at (-1 = the whole context, 0 = off; default: {d.penalty_last_n})")
    if not structured:
        return
    group.add_argument("--grammar", metavar="FILE",
                       help="constrain the output to this GBNF grammar (llama.cpp's syntax; "
                       "default: none)")
    group.add_argument("--json-schema", metavar="FILE",
                       help="constrain the output to JSON valid against this JSON Schema "
                       "(default: none)")


def shaping_fields(args: argparse.Namespace) -> dict[str, Any]:
    """GenerationParams fields from the options above."""
    grammar = None
    if getattr(args, "grammar", None) and getattr(args, "json_schema", None):
        raise InvalidParameterError("Give either --grammar or --json-schema, not both.")
    if getattr(args, "grammar", None):
        grammar = _read(args.grammar, "--grammar")
    elif getattr(args, "json_schema", None):
        text = _read(args.json_schema, "--json-schema")
        grammar = json_schema_to_gbnf(load_json_schema(text, f"--json-schema {args.json_schema}"))
    return {
        "repeat_penalty": args.repeat_penalty,
        "frequency_penalty": args.frequency_penalty,
        "presence_penalty": args.presence_penalty,
        "penalty_last_n": args.penalty_last_n,
        "grammar": grammar,
    }


def _read(path: str, option: str) -> str:
    return read_input_text(path, option)
