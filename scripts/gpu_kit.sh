#!/usr/bin/env bash
# Running the test suite on a lent GPU machine (docs/gpu.md), which reaches no package index.
#
#   bash scripts/gpu_kit.sh prepare   # here: fills .gpu/ (git-ignored via .git/info/exclude)
#   bash .gpu/device.sh [pytest args]  # there, from the repository root, with .gpu carried
#
# `prepare` packs llama-cpp-python's sdist (its vendored llama.cpp without models, docs, git
# history or the backends a CUDA build does not use: ~5 MB) and Python 3.12 wheels of
# localspec's runtime and test dependencies with their whole closure (the machine's image holds
# many, not all: fastapi needs opentelemetry-api, openai needs httpx2, llama_cpp needs
# diskcache). `device.sh` builds llama-cpp-python with CUDA (sm_90) and RPC (~260 s on 16
# cores), then localspec against it (~30 s), then runs pytest with what time is left.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$(grep -om1 'llama-cpp-python==[0-9.]*' pyproject.toml | cut -d= -f3)  # the pin
KIT=.gpu
# What the machine's image may lack; their dependencies come along (prepare) or are found
# installed there (device).
PACKAGES=(fastapi uvicorn sse-starlette prometheus-client textual platformdirs jinja2 gguf
          diskcache openai pytest-asyncio pytest-textual-snapshot safetensors)

prepare() {
    mkdir -p "$KIT" .git/info
    grep -qx "/$KIT/" .git/info/exclude 2>/dev/null || echo "/$KIT/" >> .git/info/exclude
    tmp=$(mktemp -d)
    pip download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$tmp"
    tar xzf "$tmp"/llama_cpp_python-$VERSION.tar.gz -C "$tmp"
    src="$tmp/llama_cpp_python-$VERSION"
    vendor="$src/vendor/llama.cpp"
    rm -rf "$src/.git" "$vendor"/{models,docs,benches} "$vendor/tools/ui" "$vendor"/tools/server/public*
    for backend in "$vendor"/ggml/src/ggml-*/; do
        case "$(basename "$backend")" in ggml-cpu|ggml-cuda|ggml-rpc|ggml-hip) ;; *) rm -rf "$backend" ;; esac
    done
    find "$src" \( -name "*.gguf" -o -name "*.mp4" \) -delete
    tar cJf "$KIT/llama-src.tar.xz" -C "$tmp" "llama_cpp_python-$VERSION"
    rm -rf "$KIT/whl" && mkdir -p "$KIT/whl"
    pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$KIT/whl" "${PACKAGES[@]}"
    cp scripts/gpu_kit.sh "$KIT/device.sh"
    rm -rf "$tmp"
    du -sh "$KIT"
}

device() {
    local t0; t0=$(date +%s)
    nvidia-smi -L || true
    python3 -m pip install -q --no-index --find-links "$KIT/whl" "${PACKAGES[@]}"
    if ! python3 -c "import llama_cpp" 2>/dev/null; then
        mkdir -p /tmp/llama-src && tar xJf "$KIT/llama-src.tar.xz" -C /tmp/llama-src
        (cd /tmp/llama-src/llama_cpp_python-$VERSION && \
         CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=off -DGGML_RPC=on" \
         CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --no-build-isolation --no-deps .)
    fi
    python3 -c "import localspec._core" 2>/dev/null || \
        CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --no-build-isolation --no-deps -e .
    echo "built in $(( $(date +%s) - t0 )) s"
    local left=$(( ${BUDGET:-560} - ($(date +%s) - t0) ))
    timeout "$left" python3 -m pytest -q -p no:cacheprovider "$@"
}

case "${1:-device}" in
    prepare) prepare ;;
    device) shift || true; device "$@" ;;
    *) device "$@" ;;
esac
