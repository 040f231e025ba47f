"""Terminal rendering of a benchmark report."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from localspec.bench.report import Report, Row

COLUMNS = ("", "plain tok/s", "spec tok/s", "speedup", "drafted", "accepted", "rejected",
           "accept %", "tau", "draft s", "verify s", "other s", "same")


def _cells(row: Row) -> list[str]:
    return [
        row.label, f"{row.plain_tps:.1f}", f"{row.speculative_tps:.1f}", f"{row.speedup:.2f}x",
        str(row.drafted), str(row.accepted), str(row.rejected), f"{row.acceptance_rate:.0%}",
        f"{row.mean_accepted_length:.2f}", f"{row.draft_seconds:.2f}", f"{row.verify_seconds:.2f}",
        f"{row.other_seconds:.2f}", row.identical,
    ]


def _table(title: str, rows: Sequence[Row]) -> Table:
    table = Table(title=title, title_justify="left")
    for i, name in enumerate(COLUMNS):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*_cells(row))
    return table


def print_report(report: Report, console: Console, *, per_prompt: bool) -> None:
    if per_prompt:
        console.print(_table("per prompt (medians over repeats)", report.prompts))
    console.print(_table("per category", report.categories + [report.overall]))
