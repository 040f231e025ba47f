"""Shown instead of the chat when the models could not be loaded."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Static


class ErrorScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,escape,enter", "app.quit", "Quit"),
    ]

    def __init__(self, title: str, message: str) -> None:
        super().__init__()
        self.title_text = title
        self.message = message

    def compose(self) -> ComposeResult:
        with Vertical(id="error-box"):
            yield Static(Text(self.title_text), id="error-title")
            yield Static(Text(self.message), id="error-message")
            yield Static(Text("Press q to quit."), id="error-hint")
        yield Footer()
