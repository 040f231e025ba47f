#!/usr/bin/env python3
"""Install llama-cpp-python==0.3.36 built with llama.cpp's RPC backend into this Python, and keep
llama.cpp's Hugging Face converter from the same release for the tests.

Builds the wheel once (CMAKE_ARGS="-DGGML_RPC=on"; it took 42 minutes on a loaded 2-core
machine) into a cache directory and installs that file explicitly afterwards. pip's own wheel
cache is keyed by the version, not by CMAKE_ARGS, and would hand back a CPU-only build without
a word: so the cached
file and the installed package are both checked for the RPC library, and anything else fails
loudly (exit 1).

    python scripts/llama_rpc_wheel.py [--cache-dir DIR]

Default cache: $LOCALSPEC_RPC_WHEEL_DIR, else ~/.cache/localspec/wheels/rpc ($XDG_CACHE_HOME).

The converter (`convert_hf_to_gguf.py` with its `conversion` and `gguf-py` packages, ~2 MB) is
unpacked from the release's sdist into ~/.cache/localspec/llama.cpp/0.3.36
(`converter_dir()`), where tests/heads/test_convert_head.py compares `localspec convert-head` with
it byte for byte. The sdist comes from the package index once (pip's cache afterwards).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

VERSION = "0.3.36"
RPC_LIBRARIES = ("libggml-rpc.so", "libggml-rpc.dylib", "ggml-rpc.dll")


def default_cache() -> Path:
    if os.environ.get("LOCALSPEC_RPC_WHEEL_DIR"):
        return Path(os.environ["LOCALSPEC_RPC_WHEEL_DIR"])
    return cache_home() / "wheels" / "rpc"


def cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "localspec"


def converter_dir() -> Path:
    """Where llama.cpp's converter of this release is kept (the convert-head tests read it)."""
    return cache_home() / "llama.cpp" / VERSION


CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def keep_converter(directory: Path) -> None:
    if (directory / CONVERTER_PARTS[0]).is_file():
        return
    print(f"llama_rpc_wheel: unpacking llama.cpp's converter into {directory} ...",
          file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        pip("download", "--no-deps", "--no-binary", "llama-cpp-python",
            f"llama-cpp-python=={VERSION}", "-d", tmp)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
        staging = Path(tmp) / "converter"
        with tarfile.open(sdist) as archive:
            members = []
            for member in archive.getmembers():
                if member.name.startswith(prefix) and member.isfile() and \
                        member.name[len(prefix):].startswith(CONVERTER_PARTS):
                    member.name = member.name[len(prefix):]
                    members.append(member)
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            archive.extractall(staging, members=members, **safe)  # type: ignore[arg-type]
        if not (staging / CONVERTER_PARTS[0]).is_file():
            sys.exit(f"llama_rpc_wheel: {sdist.name} has no vendor/llama.cpp/{CONVERTER_PARTS[0]}.")
        directory.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(directory, ignore_errors=True)
        shutil.move(staging, directory)


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
          "(it took 42 minutes on a loaded 2-core machine) ...", file=sys.stderr, flush=True)
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
    keep_converter(converter_dir())
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
