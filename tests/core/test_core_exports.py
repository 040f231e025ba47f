"""The extension module exports its init function alone (csrc/python/core_exports.map).

What it exports comes first in the lookup scope of libllama, which loads as its dependency: an
exported copy of std:: code (template instances, or all of libstdc++ where a toolchain links it
statically) would take libllama's own calls. On an H200 machine whose GCC linked libstdc++
statically, the std::regex of libllama's tokenizer called into the module's copy and every model
load crashed (docs/gpu.md)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localspec import _core

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="the export map is a GNU linker version script (Linux builds)"
)


def exported_symbols(library: Path) -> list[str]:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("binutils' nm is missing (it comes with the toolchain that builds localspec)")
    listing = subprocess.run([nm, "-D", "--defined-only", str(library)],
                             capture_output=True, text=True, check=True).stdout
    return sorted(line.split()[-1] for line in listing.splitlines() if line.strip())


def test_the_extension_exports_its_init_function_alone() -> None:
    assert exported_symbols(Path(_core.__file__)) == ["PyInit__core"]
