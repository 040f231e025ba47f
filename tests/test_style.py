"""The style rules the project keeps (ruff clean, type-checked Python, shell scripts that
parse), checked like any other test so that CI catches a slip. The tool versions are pinned in
the `test` extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_ruff_is_clean() -> None:
    proc = run_tool("ruff", "check", "localspec", "tui", "tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_is_clean() -> None:
    proc = run_tool("mypy", "localspec", "tui/localspec_tui")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shell_scripts_parse() -> None:
    scripts = [ROOT / ".ci" / "run", *sorted((ROOT / "scripts").glob("*.sh"))]
    for script in scripts:
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"
