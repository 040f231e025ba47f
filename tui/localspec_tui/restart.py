"""``/exact``: switch exact mode from the chat.

Exact mode is chosen when the model loads (the layout of its weights and its context's
kernels; docs/exact.md), so the chat cannot flip it under a loaded model. It restarts itself
in the other mode instead: the app exits with a ``ModeSwitch``, the command line is run again
with ``--exact`` added or removed and ``--restore FILE``, and the new chat shows the
conversation and continues it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NoReturn

from localspec.errors import InvalidParameterError


@dataclass(frozen=True)
class ModeSwitch:
    """What the restarted chat needs: the mode it runs in and the conversation so far."""

    exact: bool
    messages: list[dict[str, str]] = field(default_factory=list)
    system_prompt: str | None = None


def restart_argv(argv: list[str], exact: bool, restore: Path) -> list[str]:
    """``argv`` (the arguments after the program name) with ``--exact`` as asked and a
    ``--restore`` of its own (an earlier one dropped)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--restore":
            skip = True
        elif arg != "--exact" and not arg.startswith("--restore="):
            out.append(arg)
    return [*out, *(["--exact"] if exact else []), "--restore", str(restore)]


def save(switch: ModeSwitch) -> Path:
    handle, name = tempfile.mkstemp(prefix="localspec-chat-", suffix=".json")
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        json.dump(asdict(switch), out)
    return Path(name)


def restore(path: str) -> ModeSwitch:
    """Read (and delete) what ``save`` wrote."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        Path(path).unlink()
        messages = [{"role": str(m["role"]), "content": str(m["content"])}
                    for m in data["messages"]]
        return ModeSwitch(bool(data["exact"]), messages, data.get("system_prompt"))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise InvalidParameterError(
            f"--restore {path}: not a conversation the chat saved ({error}); start without it."
        ) from None


def restart(argv: list[str], switch: ModeSwitch) -> NoReturn:
    """Run this command again in the other mode, in this process's place."""
    path = save(switch)
    args = restart_argv(argv, switch.exact, path)
    os.execv(sys.executable, [sys.executable, "-m", "localspec.cli", *args])
