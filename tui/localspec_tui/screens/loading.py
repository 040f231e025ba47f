"""Shown while the models load (on a worker thread)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import LoadingIndicator, Static


class LoadingScreen(Screen[None]):
    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def compose(self) -> ComposeResult:
        with Vertical(id="loading-box"):
            yield Static(Text(f"Loading {self.what}…"), id="loading-text")
            yield LoadingIndicator()
