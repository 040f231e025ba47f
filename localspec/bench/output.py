"""Where a bench run's results go, checked before any model loads: the JSON results file is
written before the PNG, so a plot that fails never loses a run.

``--out FILE`` names the JSON file; with ``--plot X.png`` and no ``--out`` it is ``X.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from localspec.errors import InvalidParameterError, LocalspecError


def results_path(out: str | None, plot: str | None) -> Path | None:
    """The JSON results file: ``--out``, else next to the ``--plot`` PNG, else none."""
    if out:
        return Path(out)
    return Path(plot).with_suffix(".json") if plot else None


def check_outputs(out: str | None, plot: str | None) -> None:
    """Before running: matplotlib for --plot, and folders that exist and can be written."""
    if plot:
        require_matplotlib()
    for path in (results_path(out, plot), Path(plot) if plot else None):
        if path is None:
            continue
        folder = path.parent if str(path.parent) else Path(".")
        if not folder.is_dir():
            raise InvalidParameterError(f"Cannot write {path}: the folder {folder} does not "
                                        "exist; create it or choose another path.")
        if not os.access(folder, os.W_OK):
            raise InvalidParameterError(f"Cannot write {path}: the folder {folder} is not "
                                        "writable; choose another path.")


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise InvalidParameterError("--plot needs matplotlib, which is not installed: run "
                                    "pip install 'localspec[plot]' (or drop --plot).") from None


def write_results(path: Path, results: dict[str, Any]) -> None:
    try:
        path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    except OSError as error:
        raise LocalspecError(f"Could not write the results to {path} ({error.strerror}).") from None
