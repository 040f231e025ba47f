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

    pair: str  # e.g. "gemma-3-270m + ngram"
    drafter: str
    memory: str  # memory plan summary
    n_ctx: int


class StatusBar(Static):
    """Two lines; ``show`` redraws them from the metrics and settings."""

    def __init__(self, model: ModelLine, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id)
        self.model = model

    def show(
        self,
        metrics: ReplyMetrics | None,
        settings: ChatSettings,
        *,
        generating: bool,
        provenance: bool,
        context_used: int = 0,
    ) -> None:
        self.update(self.build(metrics, settings, generating, provenance, context_used))

    def build(
        self,
        metrics: ReplyMetrics | None,
        settings: ChatSettings,
        generating: bool,
        provenance: bool,
        context_used: int,
    ) -> Text:
        line = Text(no_wrap=True, overflow="ellipsis")
        line.append("● " if generating else "○ ", "bold green" if generating else "dim")
        stats = metrics.stats if metrics else None
        if metrics is not None and metrics.steps:
            unit = "tok/s*" if metrics.modelled else "tok/s"
            line.append(f"{metrics.rolling_tokens_per_second:5.1f}", "bold")
            line.append(f" {unit}")
        else:
            line.append("  -  tok/s")
        _sep(line)
        speculating = stats is not None and stats.drafted > 0
        line.append("accept ")
        line.append(f"{stats.acceptance_rate:4.0%}" if speculating and stats else "  - ", "bold")
        _sep(line)
        line.append("τ ")
        tau = stats.mean_accepted_length if stats and stats.target_passes else 0.0
        line.append(f"{tau:4.2f}" if tau else "  - ", "bold")
        _sep(line)
        k = settings.draft_label()
        if settings.draft_max == "auto" and stats is not None and stats.target_passes:
            k = f"auto·{stats.draft_max}"
        line.append(f"k {k}")
        _sep(line)
        line.append(f"T {settings.temperature:g}")
        _sep(line)
        if settings.speculative:
            line.append("spec ON", "bold green")
        else:
            line.append("spec OFF", "bold yellow")

        second = Text(no_wrap=True, overflow="ellipsis")
        second.append(self.model.pair, "bold")
        _sep(second)
        second.append(self.model.memory)
        _sep(second)
        second.append(f"ctx {context_used}/{self.model.n_ctx}")
        if provenance:
            _sep(second)
            second.append("■ draft", "bold green")
            second.append(" ")
            second.append("■ target", "bold #e0a040")
        return Text("\n").join([line, second])


def _sep(text: Text) -> None:
    text.append(" │ ", "dim")
