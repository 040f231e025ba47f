"""Slash commands typed into the input box (``/temp 0.7``, ``/k auto``, ...)."""

from __future__ import annotations

from dataclasses import dataclass

COMMANDS = (
    "help", "new", "copy", "colours", "quit", "temp", "k", "spec", "system", "max", "json",
    "exact",
)
ALIASES = {"colors": "colours", "clear": "new", "exit": "quit", "draft": "k", "temperature": "temp"}


@dataclass(frozen=True)
class Command:
    name: str
    argument: str


def parse_command(text: str) -> Command:
    """Split ``/name argument``; raises ValueError naming the unknown command."""
    name, _, argument = text.strip().removeprefix("/").partition(" ")
    name = ALIASES.get(name.lower(), name.lower())
    if name not in COMMANDS:
        known = ", ".join(f"/{c}" for c in COMMANDS)
        raise ValueError(f"unknown command /{name}; known: {known}")
    return Command(name, argument.strip())


def parse_switch(text: str, current: bool) -> bool:
    """``on``/``off`` (or nothing: flip the current value)."""
    value = text.strip().lower()
    if value in ("", "toggle"):
        return not current
    if value in ("on", "yes", "true", "1"):
        return True
    if value in ("off", "no", "false", "0"):
        return False
    raise ValueError(f"expected on or off, not {text!r}")


def parse_max_tokens(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"/max needs a whole number of tokens, not {text!r}") from None
    if value < 1:
        raise ValueError("/max needs at least 1 token")
    return value
