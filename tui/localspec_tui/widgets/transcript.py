"""The transcript: user turns, streaming assistant replies, and notices."""

from __future__ import annotations

from types import MappingProxyType
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Static

from ..provenance import Span, merge_spans

# Control characters (a tiny or confused model can emit them) become U+FFFD one for one, so
# the terminal is not disturbed and provenance offsets still line up with the text.
_CONTROL = MappingProxyType(
    {c: "\ufffd" for c in [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]}
)


def printable(text: str) -> str:
    return text.translate(_CONTROL)


RENDER_INTERVAL = 0.1  # seconds between two redraws of a streaming reply


class UserMessage(Static):
    """One user turn (shown verbatim, not as Markdown)."""

    def __init__(self, text: str) -> None:
        super().__init__(Text(printable(text)), classes="message")
        self.text = text


class Notice(Static):
    """A line from the app itself: trimmed history, a cancelled reply, an error."""

    def __init__(self, text: str, *, error: bool = False) -> None:
        super().__init__(Text(text), classes="notice -error" if error else "notice")
        self.text = text


class AssistantMessage(Vertical):
    """A reply, shown as the model wrote it (Markdown source included), so that turning the
    provenance colours on or off only recolours it: no line moves or changes its indent."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"assistant--draft", "assistant--target"}

    def __init__(self, show_provenance: bool) -> None:
        super().__init__(classes="message")
        self.text = ""
        self.spans: list[Span] = []
        self.show_provenance = show_provenance
        self.streaming = True
        self._render_pending = False

    def compose(self) -> ComposeResult:
        yield Static(classes="body")
        yield Static(classes="meta")

    def on_mount(self) -> None:
        self._apply_mode()

    async def append(self, text: str, spans: list[Span]) -> None:
        """Add streamed text; the body is redrawn at most every RENDER_INTERVAL seconds (a
        redraw lays out the whole reply again)."""
        self.text += printable(text)
        merge_spans(self.spans, spans)
        if not self._render_pending:
            self._render_pending = True
            self.set_timer(RENDER_INTERVAL, self._render_body)

    async def set_provenance(self, show: bool) -> None:
        if show == self.show_provenance:
            return
        self.show_provenance = show
        self._apply_mode()
        self._render_body()

    async def replace_text(self, text: str) -> None:
        """Show ``text`` instead of what was streamed (a reply joined from segments)."""
        self.text = printable(text)
        self._render_body()

    async def finish(self, meta: str) -> None:
        self.streaming = False
        self._render_body()
        self.query_one(".meta", Static).update(Text(meta))
        self.add_class("-finished")

    def body_text(self) -> Text:
        """The reply; with provenance on, draft-token and target-token characters styled apart."""
        text = Text(self.text)
        if not self.show_provenance:
            return text
        draft = self.get_component_rich_style("assistant--draft", partial=True)
        target = self.get_component_rich_style("assistant--target", partial=True)
        for start, end, kind in self.spans:
            if start < len(self.text):
                text.stylize(draft if kind == "draft" else target, start, min(end, len(self.text)))
        return text

    def provenance_text(self) -> Text:
        """The reply with its provenance styles, whether or not they are shown."""
        shown, self.show_provenance = self.show_provenance, True
        try:
            return self.body_text()
        finally:
            self.show_provenance = shown

    def _render_body(self) -> None:
        self._render_pending = False
        self.query_one(".body", Static).update(self.body_text())

    def _apply_mode(self) -> None:
        self.set_class(self.show_provenance, "-provenance")


class Transcript(VerticalScroll):
    """Scrolls to the end as replies stream in, unless the user scrolled up."""

    can_focus = True

    async def add(self, widget: Static | AssistantMessage) -> None:
        follow = self.is_vertical_scroll_end or self.max_scroll_y == 0
        await self.mount(widget)
        if follow:
            self.scroll_end(animate=False)

    def follow(self) -> None:
        if self.max_scroll_y - self.scroll_y <= 3:
            self.scroll_end(animate=False)

    async def set_provenance(self, show: bool) -> None:
        for message in self.query(AssistantMessage):
            await message.set_provenance(show)

    async def clear(self) -> None:
        await self.remove_children()
