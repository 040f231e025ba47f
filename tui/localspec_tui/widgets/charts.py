"""Sparklines of tokens/s and acceptance over the current reply."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widget import Widget
from textual.widgets import Label

from ..metrics import ReplyMetrics

BARS = "▁▂▃▄▅▆▇█"
NO_VALUE = "·"  # a step with nothing to show (acceptance of a step that drafted nothing)


def spark_text(values: Sequence[float | None], width: int, high: float) -> str:
    """One character per step (steps averaged into buckets once the reply outgrows ``width``).
    ``None`` is no value, drawn as ``NO_VALUE`` (never as the lowest bar, which means zero);
    a bucket averages the values it has and is ``NO_VALUE`` only when it has none."""
    if width <= 0 or not values:
        return ""
    if len(values) > width:
        size = len(values) / width
        buckets = [
            values[int(i * size) : max(int((i + 1) * size), int(i * size) + 1)]
            for i in range(width)
        ]
        values = [_mean([v for v in b if v is not None]) for b in buckets]
    top = high if high > 0 else 1.0
    return "".join(
        NO_VALUE if v is None
        else BARS[min(len(BARS) - 1, max(0, int(v / top * (len(BARS) - 1) + 0.5)))]
        for v in values
    )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class Spark(Widget):
    """A one-line sparkline from zero to ``high`` (or to the data's maximum)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"spark--bar"}
    DEFAULT_CSS = "Spark { height: 1; width: 1fr; }"

    def __init__(self, high: float | None = None, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id)
        self.high = high
        self.values: list[float | None] = []

    def set_values(self, values: Sequence[float | None]) -> None:
        self.values = list(values)
        self.refresh()

    def render(self) -> Text:
        high = (self.high if self.high is not None
                else max((v for v in self.values if v is not None), default=1.0))
        style = self.get_component_rich_style("spark--bar", partial=True)
        return Text(spark_text(self.values, self.size.width, high), style=style, no_wrap=True)


class SparkRow(Horizontal):
    """``tok/s ▂▃▅▇▆  accept ▅▇·▃▆`` for the reply being generated (or the last one); ``·``
    marks a step that drafted nothing (its acceptance is no value, not a rejection)."""

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id)
        self.rate = Spark(id="rate-spark")
        self.acceptance = Spark(high=1.0, id="accept-spark")  # 0..100 %, always to scale

    def compose(self) -> ComposeResult:
        yield Label("tok/s ", classes="spark-label")
        yield self.rate
        yield Label(" accept ", classes="spark-label")
        yield self.acceptance

    def show(self, metrics: ReplyMetrics | None) -> None:
        self.rate.set_values(metrics.rate_history if metrics else [])
        self.acceptance.set_values(metrics.acceptance_history if metrics else [])
