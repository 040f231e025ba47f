"""Helpers shared by the test modules: the command line as a user runs it (a subprocess)."""

from __future__ import annotations

import subprocess
import sys


def run_localspec(*args: str, stdin: str | None = None, env: dict[str, str] | None = None,
                  timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``localspec ARGS`` in a child process (this interpreter), its output captured as text."""
    return subprocess.run([sys.executable, "-m", "localspec.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout, env=env)


def run_bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``localspec bench --threads 1 ARGS``."""
    return run_localspec("bench", "--threads", "1", *args, env=env)
