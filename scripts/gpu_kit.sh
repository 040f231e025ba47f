#!/usr/bin/env bash
# Running the test suite on a lent GPU machine (docs/gpu.md), which reaches no package index.
#
#   bash scripts/gpu_kit.sh prepare     # here: fills .gpu/ (git-ignored via .git/info/exclude)
#   bash scripts/gpu_kit.sh cuda-wheel  # here, optional (~42 min on 2 cores): .gpu/cuwhl/
#   bash .gpu/device.sh [pytest args]    # there, from the repository root, with .gpu carried
#
# `prepare` packs llama-cpp-python's sdist (its vendored llama.cpp without models, docs, git
# history or the backends a CUDA build does not use: ~5 MB) and Python 3.12 wheels of
# localspec's runtime and test dependencies with their whole closure (the machine's image holds
# many, not all: fastapi needs opentelemetry-api, openai needs httpx2, llama_cpp needs
# diskcache). `device.sh` builds llama-cpp-python with CUDA (sm_90) and RPC (~260 s on 16
# cores), then localspec against it (~30 s), then runs pytest with what time is left.
# `cuda-wheel` builds that llama-cpp-python here instead (nvcc is here; cuBLAS comes from its
# wheel, libcuda from an empty stub), so that the device spends ~45 s installing, not ~310 s
# building: carry .gpu/whl, .gpu/cuwhl and .gpu/device.sh (under the 64 MiB a call carries).
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
    rm -rf "$KIT/whl"
    mkdir -p "$KIT/whl"
    pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$KIT/whl" "${PACKAGES[@]}"
    rm -f "$KIT"/whl/numpy-*.whl  # the image holds numpy; 15 MB less to carry
    cp scripts/gpu_kit.sh "$KIT/device.sh"
    rm -rf "$tmp"
    du -sh "$KIT"
}

cuda_wheel() {
    # The toolkit's root as nvcc reports it (nvcc on PATH may be a wrapper script, not a link).
    local cuda tmp; cuda=${CUDA_HOME:-$(nvcc --dryrun -c x.cu 2>&1 | sed -n 's/^#\$ TOP=//p')}
    [ -x "$cuda/bin/nvcc" ] || { echo "no CUDA toolkit found: put nvcc on PATH or set CUDA_HOME" >&2; exit 2; }
    tmp=$(mktemp -d)
    local lib="$cuda/targets/x86_64-linux/lib" inc="$cuda/targets/x86_64-linux/include"
    if [ ! -e "$inc/cublas_v2.h" ]; then
        pip download -q --no-deps --only-binary=:all: "nvidia-cublas>=13,<14" -d "$tmp"
        unzip -q "$tmp"/nvidia_cublas-*.whl -d "$tmp/cublas"
        # One command a line: set -e does not stop at a failure inside an && list.
        cp "$tmp"/cublas/nvidia/cu*/include/* "$inc/"
        cp "$tmp"/cublas/nvidia/cu*/lib/* "$lib/"
        ln -sf libcublas.so.13 "$lib/libcublas.so"
        ln -sf libcublasLt.so.13 "$lib/libcublasLt.so"
    fi
    if [ ! -e "$lib/stubs/libcuda.so" ]; then  # links only: the device's driver is preloaded there
        mkdir -p "$lib/stubs"
        echo 'void localspec_stub(void) {}' > "$tmp/stub.c"
        gcc -shared -o "$lib/stubs/libcuda.so" -Wl,-soname,libcuda.so.1 "$tmp/stub.c"
    fi
    mkdir -p "$tmp/src" "$tmp/whl" "$tmp/site" "$KIT/cuwhl"
    tar xJf "$KIT/llama-src.tar.xz" -C "$tmp/src"
    local cpu="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
    cpu+=" -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"
    cpu+=" -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=ON -DGGML_AMX_INT8=ON -DGGML_AMX_BF16=ON"  # the lent Xeons
    (cd "$tmp/src/llama_cpp_python-$VERSION" && CUDACXX="$cuda/bin/nvcc" \
     CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=off -DGGML_RPC=on $cpu" \
     pip wheel -q --no-build-isolation --no-deps . -w "$tmp/whl")
    unzip -q "$tmp"/whl/*.whl -d "$tmp/site"
    # A wheel holds each library three times (.so, .so.0, .so.0.x) and twice more under lib/:
    # keep llama_cpp/lib's .so.0 and make the rest links to it.
    local libs="$tmp/site/llama_cpp/lib"
    for f in "$libs"/*.so* "$tmp"/site/lib/*.so*; do
        local base target; base=$(basename "$f"); base=${base%%.so*}; target=$base.so.0
        [ -e "$libs/$target" ] || { rm -f "$f"; continue; }  # lib/'s extras (llama-common)
        [ "$f" = "$libs/$target" ] && continue
        [ "$(dirname "$f")" = "$libs" ] || target=../llama_cpp/lib/$target
        rm -f "$f"; ln -s "$target" "$f"
    done
    tar cf - -C "$tmp/site" . | xz -T0 -6 > "$KIT/cuwhl/llama_cuda.tar.xz"
    rm -rf "$tmp"
    du -sh "$KIT/cuwhl"
}

device() {
    local t0; t0=$(date +%s)
    nvidia-smi -L || true
    python3 -m pip install -q --no-index --find-links "$KIT/whl" "${PACKAGES[@]}"
    if [ -e "$KIT/cuwhl/llama_cuda.tar.xz" ]; then  # cuda-wheel's build, made elsewhere
        tar xJf "$KIT/cuwhl/llama_cuda.tar.xz" -C "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
        LD_PRELOAD=$(ldconfig -p | grep -m1 'libcuda.so.1 ' | awk '{print $NF}'); export LD_PRELOAD
        export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}  # its cuBLAS
    fi
    if ! python3 -c "import llama_cpp" 2>/dev/null; then
        mkdir -p /tmp/llama-src
        tar xJf "$KIT/llama-src.tar.xz" -C /tmp/llama-src
        (cd /tmp/llama-src/llama_cpp_python-$VERSION && \
         CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=off -DGGML_RPC=on" \
         CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --no-build-isolation --no-deps .)
    fi
    python3 -c "import localspec._core" 2>/dev/null || \
        CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install -q --no-build-isolation --no-deps -e .
    echo "built in $(( $(date +%s) - t0 )) s"
    local left=$(( ${BUDGET:-560} - ($(date +%s) - t0) )) log=${OUT:-/tmp}/pytest.log rc=0 skip=()
    # ruff and mypy are development tools the image lacks: their style tests would fail there.
    python3 -c "import mypy, ruff" 2>/dev/null || skip=(--deselect tests/test_style.py::test_mypy_is_clean
                                                          --deselect tests/test_style.py::test_ruff_is_clean)
    # -v writes each test's outcome as it ends (with xdist: "[gw3] FAILED tests/..."), so a run
    # stopped at its time limit still names its failures; the log lands in $OUT when there is one.
    timeout "$left" python3 -m pytest -v -rfE -p no:cacheprovider "${skip[@]}" "$@" > "$log" 2>&1 || rc=$?
    grep -E " (FAILED|ERROR) " "$log" | sed -E 's/^\[gw[0-9]+\] \[ *[0-9]+%\] //' | sort -u | tail -80 || true
    tail -n 3 "$log"
    echo "pytest rc=$rc (124: stopped at the time limit) in $(( $(date +%s) - t0 )) s; log: $log"
    return "$rc"
}

case "${1:-device}" in
    prepare) prepare ;;
    cuda-wheel) cuda_wheel ;;
    device) shift || true; device "$@" ;;
    *) device "$@" ;;
esac
