"""The help screen: keys, slash commands and what the numbers mean."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from ..settings import DRAFT_CYCLE_TEXT

HELP_TEMPLATE = """\
# localspec chat

A small **drafter** proposes tokens; the **target** model checks them all in one pass and
keeps the longest correct prefix. You get exactly the target's answer, faster.

| Key | Action |
|---|---|
| Enter | send the message |
| Esc | stop the reply in progress |
| F1 | this help |
| F2 | speculation on / off (live: the reply continues) |
| F3 | draft length: {draft_cycle} |
| F4 | temperature: 0, 0.2, 0.5, 0.8, 1.0 |
| F5 | provenance colours on / off |
| Ctrl+N | new chat |
| Ctrl+Y | copy the last answer |
| Ctrl+Q | quit |

Commands: `/temp 0.7`, `/k 4`, `/k auto`, `/spec on|off`, `/system TEXT`,
`/max 256`, `/json on|off`, `/exact on|off` (loads the model again in that mode; the
conversation goes on), `/new`, `/copy`, `/colours`, `/help`, `/quit`.

**Status bar.** *tok/s*: generated tokens per second over the last steps while a reply
streams, over the whole reply once it ended (as its closing line says), without prompt
processing. *accept*: accepted / drafted
tokens. *τ*: tokens per target pass (1.00 = plain decoding). *k*: the draft length (`auto·4`:
the controller chose 4 in the last step). *ctx*: tokens in the context.

**Provenance colours** (F5; the status bar shows the legend `■ draft ■ target`). Green
characters came from accepted draft tokens; amber ones the target wrote itself (a correction
after a rejection, or the bonus token after a fully accepted draft). Replies are shown as the
model wrote them, Markdown included, so colours on or off never move the text. The
sparklines show tokens/s and the acceptance of each step of the reply (`·`: a step that
drafted nothing, so it has no acceptance).
"""
HELP = HELP_TEMPLATE.replace("{draft_cycle}", DRAFT_CYCLE_TEXT)


SCROLL_HINT = "↑↓ PgUp PgDn scroll · Esc closes"
CLOSE_HINT = "Esc closes"


class HelpScreen(ModalScreen[None]):
    """The help in a box; when it is taller than the terminal the box's bottom edge says that
    it scrolls (and the keys that scroll it)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,f1,q", "dismiss", "Close"),
    ]

    def compose(self) -> ComposeResult:
        box = VerticalScroll(id="help-box")
        box.border_title = "Help"
        box.border_subtitle = SCROLL_HINT
        with box:
            yield Markdown(HELP)

    def on_mount(self) -> None:
        self.call_after_refresh(self.update_hint)

    def on_resize(self) -> None:
        self.call_after_refresh(self.update_hint)

    def update_hint(self) -> None:
        box = self.query_one("#help-box", VerticalScroll)
        box.border_subtitle = SCROLL_HINT if box.max_scroll_y > 0 else CLOSE_HINT

    def action_dismiss(self, result: None = None) -> None:  # type: ignore[override]
        self.dismiss(None)
