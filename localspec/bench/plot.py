"""Optional PNG of a benchmark: speedup per category and for all prompts (values on the bars),
and the accepted-length histogram, under a title naming the model, the drafter and the machine.

Needs matplotlib (``pip install 'localspec[plot]'``); the bench checks for it before it runs
(localspec.bench.output) and writes the JSON results before the plot.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from localspec.bench.report import Report
from localspec.errors import LocalspecError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CATEGORY_COLOUR = "#4c72b0"
ALL_COLOUR = "#dd8452"


def machine() -> str:
    """``AMD EPYC 7B13, 2 cores`` (what the numbers were measured on)."""
    return f"{_cpu_name() or platform.machine() or 'unknown CPU'}, {os.cpu_count() or '?'} cores"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


def title_lines(header: dict[str, Any]) -> tuple[str, str]:
    """The model, the drafter and the machine; then the run's settings."""
    target = PurePath(str(header.get("target", "?"))).name
    drafter = PurePath(str(header.get("drafter", "?"))).name
    first = f"{target} drafted by {drafter} | {machine()}"
    settings = [f"{header[key]} {label}" for key, label in
                (("max_tokens", "tokens"), ("repeat", "repeat(s)")) if key in header]
    if "temperature" in header:
        settings.append(f"temperature {header['temperature']}")
    if "draft_max" in header:
        settings.append(f"draft {header['draft_max']}")
    return first, ", ".join(settings)


def figure(report: Report, header: dict[str, Any]) -> Figure:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.6))
    left, right = fig.subplots(1, 2)
    rows = [*report.categories, report.overall]
    colours = [CATEGORY_COLOUR] * len(report.categories) + [ALL_COLOUR]
    bars = left.bar([row.label for row in rows], [row.speedup for row in rows], color=colours)
    left.bar_label(bars, labels=[f"{row.speedup:.2f}x" for row in rows], fontsize=8)
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_ylabel("speedup over plain decoding")
    left.set_title("speedup per category and for all prompts")
    left.tick_params(axis="x", rotation=30)
    left.margins(y=0.15)
    hist = report.accepted_length_histogram
    counts = right.bar(range(len(hist)), hist, color="#55a868")
    right.bar_label(counts, fontsize=8)
    right.set_xticks(range(len(hist)))
    right.set_xlabel("drafted tokens accepted in a target pass")
    right.set_ylabel("passes")
    right.set_title(f"accepted length (tau {report.overall.mean_accepted_length:.2f})")
    right.margins(y=0.15)
    first, second = title_lines(header)
    fig.suptitle(f"{first}\n{second}", fontsize=10)
    fig.tight_layout()
    return fig


def write_plot(report: Report, path: str, header: dict[str, Any],
               results_file: Path | None = None) -> None:
    """Write the PNG; a failure says where the results already are."""
    kept = f"; the results are in {results_file}" if results_file else ""
    try:
        figure(report, header).savefig(path, dpi=100)
    except ImportError:
        raise LocalspecError(f"--plot needs matplotlib: pip install 'localspec[plot]'{kept}."
                             ) from None
    except (OSError, ValueError) as error:
        raise LocalspecError(f"Could not write the plot {path} ({error}){kept}.") from None
