"""The status bar: live speculation numbers on top, the loaded pair and memory below."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.widgets import Static

from ..metrics import ReplyMetrics
from ..settings import ChatSettings


@dataclass(frozen=True)
class ModelLine:
    """What is loaded: shown on the second line of the status bar."""

    target: str  # e.g. "gemma-3-270m" or "tiny-pair: tiny-target"
    drafter: str  # e.g. "ngram" or "ngram+qwen2.5-coder-0.5b-instruct-q4_k_m"
    memory: str  # memory plan summary
    n_ctx: int


Segment = tuple[int, Text]  # (priority: 0 is kept longest, larger numbers go first), text


class StatusBar(Static):
    """Two lines; ``show`` redraws them from the metrics and settings. When the terminal is
    narrow, the least important parts go first (line 1: temperature, then k; line 2: the
    memory plan, the target's name, then the drafter), so the numbers, ``ctx`` and the colour
    legend stay."""

    def __init__(self, model: ModelLine, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id)
        self.model = model
        self._last: tuple[ReplyMetrics | None, ChatSettings, bool, bool, int] | None = None

    def show(
        self,
        metrics: ReplyMetrics | None,
        settings: ChatSettings,
        *,
        generating: bool,
        provenance: bool,
        context_used: int = 0,
    ) -> None:
        self._last = (metrics, settings, generating, provenance, context_used)
        self.update(self.build(metrics, settings, generating, provenance, context_used))

    def on_resize(self) -> None:
        if self._last is not None:
            self.update(self.build(*self._last))

    def build(
        self,
        metrics: ReplyMetrics | None,
        settings: ChatSettings,
        generating: bool,
        provenance: bool,
        context_used: int,
        width: int | None = None,
    ) -> Text:
        if width is None:
            width = self.content_size.width or 78
        first = fit(numbers_line(metrics, settings, generating), width)
        second = fit(model_line(self.model, provenance, context_used), width)
        return Text("\n").join([first, second])


def numbers_line(metrics: ReplyMetrics | None, settings: ChatSettings,
                 generating: bool) -> list[Segment]:
    rate = Text()
    rate.append("● " if generating else "○ ", "bold green" if generating else "dim")
    if metrics is not None and metrics.steps:
        rate.append(f"{metrics.shown_tokens_per_second(generating):5.1f}", "bold")
        rate.append(" tok/s")
    else:
        rate.append("  -  tok/s")
    stats = metrics.stats if metrics else None
    speculating = stats is not None and stats.drafted > 0
    accept = Text("accept ").append(
        f"{stats.acceptance_rate:4.0%}" if speculating and stats else "  - ", "bold")
    tau_value = stats.mean_accepted_length if stats and stats.target_passes else 0.0
    tau = Text("τ ").append(f"{tau_value:4.2f}" if tau_value else "  - ", "bold")
    k = settings.draft_label()
    if settings.draft_max == "auto" and stats is not None and stats.target_passes:
        k = f"auto·{stats.last_drafted}"
    spec = (Text("spec ON", "bold green") if settings.speculative
            else Text("spec OFF", "bold yellow"))
    return [(0, rate), (1, accept), (1, tau), (3, Text(f"k {k}")),
            (4, Text(f"T {settings.temperature:g}")), (0, spec)]


def model_line(model: ModelLine, provenance: bool, context_used: int) -> list[Segment]:
    # The drafter outlives the target's name when space is short: it is what speculates.
    segments: list[Segment] = [(3, Text(model.target, "bold")),
                               (2, Text(f"drafter {model.drafter}")), (4, Text(model.memory)),
                               (1, Text(f"ctx {context_used}/{model.n_ctx}"))]
    if provenance:
        legend = Text("colours: ")
        legend.append("■ draft", "bold green").append(" ").append("■ target", "bold #e0a040")
        segments.append((0, legend))
    return segments


def fit(segments: list[Segment], width: int) -> Text:
    """The segments joined by separators, dropping the least important until they fit; what
    still does not fit ends in an ellipsis."""
    kept = list(segments)
    while len(kept) > 1 and _joined(kept).cell_len > width:
        kept.remove(max(reversed(kept), key=lambda segment: segment[0]))
    line = _joined(kept)
    line.no_wrap, line.overflow = True, "ellipsis"
    line.truncate(width, overflow="ellipsis")
    return line


def _joined(segments: list[Segment]) -> Text:
    return Text(" │ ", "dim").join(text for _, text in segments)
