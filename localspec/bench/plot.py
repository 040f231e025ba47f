"""Optional PNG of a benchmark: speedup per category and the accepted-length histogram."""

from __future__ import annotations

from localspec.bench.report import Report
from localspec.errors import LocalspecError


def write_plot(report: Report, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LocalspecError("--plot needs matplotlib: pip install matplotlib") from None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [row.label for row in report.categories]
    left.bar(labels, [row.speedup for row in report.categories], color="#4c72b0")
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_ylabel("speedup over plain decoding")
    left.set_title("speedup per category")
    left.tick_params(axis="x", rotation=30)
    hist = report.accepted_length_histogram
    right.bar(range(len(hist)), hist, color="#55a868")
    right.set_xticks(range(len(hist)))
    right.set_xlabel("drafted tokens accepted in a target pass")
    right.set_ylabel("passes")
    right.set_title("accepted length")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
