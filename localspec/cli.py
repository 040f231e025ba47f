"""The `localspec` command line. Each subcommand lives in its own module under
``localspec/commands`` and exposes ``register(subparsers)``, which adds its parser and sets
``func`` (``args -> int exit code``). Packages outside localspec (the chat UI) add commands
through the ``localspec.commands`` entry-point group, so localspec never imports them.

A LocalspecError anywhere becomes one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import import_module
from importlib.metadata import entry_points

from localspec.errors import LocalspecError

BUILTIN_COMMANDS = (
    "localspec.commands.run",
    "localspec.commands.serve",
    "localspec.commands.models",
    "localspec.commands.pull",
    "localspec.commands.plan",
    "localspec.commands.check",
    "localspec.commands.quantize",
    "localspec.commands.convert_head",
    "localspec.commands.bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="localspec",
        description="Speculative decoding for GGUF models: same output as the target, faster.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in BUILTIN_COMMANDS:
        import_module(module_name).register(subparsers)
    for plugin in entry_points(group="localspec.commands"):
        plugin.load()(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except LocalspecError as error:
        print(f"localspec: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("localspec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
