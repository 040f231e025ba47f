#!/usr/bin/env python3
"""Build llama.cpp's own speculative decoding program, `llama-speculative-simple`, from the
llama.cpp that llama-cpp-python==0.3.36 vendors: the baseline `localspec bench --baseline
llama-speculative` runs (its draft-model and n-gram arms; docs/bench.md).

    python scripts/llama_speculative_build.py [--jobs N]

The sdist comes from the package index (pip's cache afterwards); its vendor/llama.cpp is built
with CMake in a temporary directory (examples only: no server, tools or tests, no HTTPS; the
CPU's native instructions, as pip builds llama-cpp-python here) and the static program is kept
in ~/.cache/localspec/llama.cpp/0.3.36/bin ($XDG_CACHE_HOME; `localspec.bench.llama_speculative`
looks there, or at $LOCALSPEC_LLAMA_SPECULATIVE). About 10 minutes on a 2-core machine. Needs
cmake and a C++17 compiler; exit 1 with one sentence when the build fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"
PROGRAM = "llama-speculative-simple"


def target_path() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "localspec"
    return cache / "llama.cpp" / VERSION / "bin" / PROGRAM


def run(*args: str, cwd: Path | None = None) -> None:
    print("+", " ".join(args), file=sys.stderr, flush=True)
    if subprocess.run(args, cwd=cwd, check=False).returncode != 0:
        sys.exit(f"llama_speculative_build: `{' '.join(args[:3])} ...` failed.")


def unpack_llama_cpp(tmp: Path) -> Path:
    """vendor/llama.cpp of the pinned llama-cpp-python sdist, unpacked under ``tmp``."""
    run(sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
        f"llama-cpp-python=={VERSION}", "-d", str(tmp))
    sdist = next(tmp.glob("llama_cpp_python-*.tar.gz"))
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        archive.extractall(tmp, members=members, **safe)  # type: ignore[arg-type]
    return tmp / prefix


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    if shutil.which("cmake") is None:
        sys.exit("llama_speculative_build: cmake is not on PATH (pip install cmake).")
    target = target_path()
    with tempfile.TemporaryDirectory() as folder:
        source = unpack_llama_cpp(Path(folder))
        build = Path(folder) / "build"
        run("cmake", "-S", str(source), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
            "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_TOOLS=OFF",
            "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_APP=OFF",
            "-DLLAMA_OPENSSL=OFF", "-DGGML_NATIVE=ON")
        run("cmake", "--build", str(build), "--target", PROGRAM, "-j", str(args.jobs))
        built = next(build.rglob(PROGRAM), None)
        if built is None:
            sys.exit(f"llama_speculative_build: the build made no {PROGRAM}.")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, target)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
