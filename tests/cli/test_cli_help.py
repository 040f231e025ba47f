"""One command line: every command that loads models takes the same model flags, and every flag
has a help text that shows its default."""

from __future__ import annotations

import argparse

import pytest

from localspec.cli import build_parser

MODEL_FLAGS = {"--pair", "--target", "--draft", "--ctx", "--kv-type", "--budget", "--llama-head"}
LOADING_COMMANDS = ("run", "chat", "serve", "bench", "check")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings if s.startswith("--")}


@pytest.mark.parametrize("command", [*LOADING_COMMANDS, "plan"])
def test_model_flags_everywhere(command: str) -> None:
    flags = set(options(subcommands()[command]))
    assert flags >= MODEL_FLAGS
    if command in LOADING_COMMANDS:
        assert flags >= {"--threads", "--n-gpu-layers", "--verbose", "--no-repack"}
    if command in ("run", "chat"):
        assert "--no-speculation" in flags


def test_every_flag_has_help_and_a_shown_default() -> None:
    missing = []
    for name, parser in subcommands().items():
        for flag, action in options(parser).items():
            text = (action.help or "") % {"default": action.default}
            if flag == "--help" or "deprecated" in text or action.required:
                continue
            if "default" not in text:
                missing.append(f"{name} {flag}")
    assert missing == []


def test_draft_help_names_every_drafter_kind() -> None:
    text = options(subcommands()["run"])["--draft"].help or ""
    for kind in ("ngram", "none", "hybrid:"):
        assert kind in text


def test_old_spellings_still_work_and_warn(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    args = parser.parse_args(["chat", "mypair", "--no-spec"])
    assert args.old_pair == "mypair" and args.no_speculation is True
    assert capsys.readouterr().err.count("deprecated") == 2
    args = parser.parse_args(["serve", "--pair", "mypair"])
    assert args.pair == "mypair" and args.old_pair is None
    assert "deprecated" not in capsys.readouterr().err
