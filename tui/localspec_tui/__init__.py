"""``localspec chat``: a Textual terminal chat that shows speculative decoding live.

Installed as the package ``localspec_tui``; it imports ``localspec`` and is never imported by
it (the ``chat`` subcommand is registered through the ``localspec.commands`` entry points).
Attributes load lazily, so registering the subcommand does not import Textual.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ChatApp", "ChatSettings"]


def __getattr__(name: str) -> Any:
    if name == "ChatApp":
        from .app import ChatApp

        return ChatApp
    if name == "ChatSettings":
        from .settings import ChatSettings

        return ChatSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
