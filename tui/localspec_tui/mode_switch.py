"""``/exact``: switch exact mode from the chat.

Exact mode is chosen when the model loads (the layout of its weights and its context's
kernels; docs/exact.md), so the chat cannot flip it under a loaded engine. It loads the models
again in the other mode, in this process (each llama.cpp context chooses its own kernels): the
chat screen posts a ``ModeSwitch`` with the conversation so far, the app closes the engine it
owns, loads the other mode behind the loading screen and opens a chat screen that shows the
conversation and continues it. Where the other mode cannot load (exact mode with the target's
layers on a GPU, say), the mode the chat was in loads again and the chat says why, keeping the
conversation either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModeSwitch:
    """The mode to load and the conversation to carry into it."""

    exact: bool
    messages: list[dict[str, str]] = field(default_factory=list)
    system_prompt: str | None = None
    # Set when the asked mode did not load and the chat went on in the other (`exact`).
    refused: str | None = None
