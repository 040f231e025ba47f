"""The `localspec` command line. Each subcommand lives in its own module under
``localspec/commands`` and exposes ``register(subparsers)``, which adds its parser and sets
``func`` (``args -> int exit code``). Packages outside localspec (the chat UI) add commands
through the ``localspec.commands`` entry-point group, so localspec never imports them.

A LocalspecError anywhere becomes one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import import_module
from importlib.metadata import PackageNotFoundError, entry_points, version

from localspec import __version__
from localspec.errors import InvalidParameterError, LocalspecError

BUILTIN_COMMANDS = (
    "localspec.commands.run",
    "localspec.commands.serve",
    "localspec.commands.models",
    "localspec.commands.pull",
    "localspec.commands.plan",
    "localspec.commands.check",
    "localspec.commands.quantize",
    "localspec.commands.convert_head",
    "localspec.commands.train_head",
    "localspec.commands.bench",
    "localspec.commands.rpc_worker",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="localspec",
        description="Speculative decoding for GGUF models: same output as the target, faster.",
    )
    parser.add_argument("--version", action="version", version=version_text())
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module_name in BUILTIN_COMMANDS:
        import_module(module_name).register(subparsers)
    for plugin in entry_points(group="localspec.commands"):
        plugin.load()(subparsers)
    return parser


def version_text() -> str:
    """``localspec 0.1.0 (llama-cpp-python 0.3.36)``: the llama.cpp build is that package's."""
    try:
        llama = version("llama-cpp-python")
    except PackageNotFoundError:
        llama = "not installed"
    return f"localspec {__version__} (llama-cpp-python {llama})"


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        check_text_arguments(arguments)
    except LocalspecError as error:
        print(f"localspec: error: {error}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(arguments)
    try:
        return int(args.func(args))
    except LocalspecError as error:
        print(f"localspec: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("localspec: interrupted", file=sys.stderr)
        return 130


def check_text_arguments(arguments: Sequence[str]) -> None:
    """Refuse arguments that are not valid UTF-8: Python keeps undecodable bytes as lone
    surrogates, which no tokenizer, file name check or JSON output can take."""
    for argument in arguments:
        if any("\ud800" <= char <= "\udfff" for char in argument):
            raise InvalidParameterError(
                f"The argument {_raw(argument)!r} is not valid UTF-8 text; pass arguments in "
                "UTF-8."
            )


def _raw(argument: str) -> bytes:
    try:
        return os.fsencode(argument)  # the bytes as they came (surrogateescape)
    except UnicodeEncodeError:
        return argument.encode("utf-8", "backslashreplace")


if __name__ == "__main__":
    sys.exit(main())
