#!/usr/bin/env python3
"""Install llama-cpp-python==0.3.36 built with llama.cpp's RPC backend into this Python.

Builds the wheel once (CMAKE_ARGS="-DGGML_RPC=on", 6-15 minutes on 2 cores) into a cache
directory and installs that file explicitly afterwards. pip's own wheel cache is keyed by the
version, not by CMAKE_ARGS, and would hand back a CPU-only build without a word: so the cached
file and the installed package are both checked for the RPC library, and anything else fails
loudly (exit 1).

    python scripts/llama_rpc_wheel.py [--cache-dir DIR]

Default cache: $LOCALSPEC_RPC_WHEEL_DIR, else ~/.cache/localspec/wheels/rpc ($XDG_CACHE_HOME).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

VERSION = "0.3.36"
RPC_LIBRARIES = ("libggml-rpc.so", "libggml-rpc.dylib", "ggml-rpc.dll")


def default_cache() -> Path:
    if os.environ.get("LOCALSPEC_RPC_WHEEL_DIR"):
        return Path(os.environ["LOCALSPEC_RPC_WHEEL_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "localspec" / "wheels" / "rpc"


def wheel_has_rpc(wheel: Path) -> bool:
    with zipfile.ZipFile(wheel) as archive:
        return any(Path(name).name.startswith(RPC_LIBRARIES) for name in archive.namelist())


def pip(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, env=env)


def cached_wheel(cache: Path) -> Path | None:
    for wheel in sorted(cache.glob(f"llama_cpp_python-{VERSION}-*.whl")):
        if wheel_has_rpc(wheel):
            return wheel
        print(f"llama_rpc_wheel: {wheel} has no RPC backend; removing it.", file=sys.stderr)
        wheel.unlink()
    return None


def build_wheel(cache: Path) -> Path:
    print(f"llama_rpc_wheel: building llama-cpp-python {VERSION} with -DGGML_RPC=on "
          "(6-15 minutes on 2 cores) ...", file=sys.stderr, flush=True)
    env = dict(os.environ, CMAKE_ARGS="-DGGML_RPC=on")
    with tempfile.TemporaryDirectory() as tmp:
        pip("wheel", "--no-deps", "--no-cache-dir", "--no-binary", "llama-cpp-python",
            f"llama-cpp-python=={VERSION}", "-w", tmp, env=env)
        built = next(Path(tmp).glob("llama_cpp_python-*.whl"))
        if not wheel_has_rpc(built):
            sys.exit(f"llama_rpc_wheel: the wheel built with -DGGML_RPC=on has no RPC library "
                     f"({', '.join(RPC_LIBRARIES)}); check the build log above.")
        cache.mkdir(parents=True, exist_ok=True)
        target = cache / built.name
        shutil.move(built, target)
    return target


def installed_has_rpc() -> bool:
    try:
        if importlib.metadata.version("llama-cpp-python") != VERSION:
            return False
    except importlib.metadata.PackageNotFoundError:
        return False
    spec = importlib.util.find_spec("llama_cpp")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return False
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return any(any(lib.glob(name + "*")) for name in RPC_LIBRARIES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", type=Path, default=default_cache())
    args = parser.parse_args()
    if installed_has_rpc():
        print("llama_rpc_wheel: the installed llama-cpp-python has the RPC backend.",
              file=sys.stderr)
        return 0
    wheel = cached_wheel(args.cache_dir) or build_wheel(args.cache_dir)
    pip("install", "--force-reinstall", "--no-deps", str(wheel))
    pip("install", str(wheel))  # its dependencies, from the index or pip's cache
    if not installed_has_rpc():
        sys.exit(f"llama_rpc_wheel: installed {wheel} but llama_cpp/lib has no RPC library; "
                 "another llama-cpp-python may shadow it.")
    print(f"llama_rpc_wheel: installed {wheel.name} with the RPC backend.", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
