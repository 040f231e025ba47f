"""localspec's body matrix products (csrc/kernels/body_matmul.h), run through real ggml graphs on
the
CPU backend: the same products as ggml's own kernels, and every row's bits independent of how
many rows share the product and of the split over threads."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from localspec import _core


def cpu_has_avx2() -> bool:
    try:
        return " avx2 " in Path("/proc/cpuinfo").read_text() + " "
    except OSError:
        return False


def test_the_kernels_exist_on_an_avx2_cpu() -> None:
    """A build that lost its x86 kernels would skip every test below and fall back silently
    (llama.cpp's head and body kernels): on an x86-64 CPU with AVX2 they must be there."""
    if not (platform.machine() in ("x86_64", "AMD64") and cpu_has_avx2()):
        pytest.skip("not an x86-64 CPU with AVX2")
    assert _core.q8_head_supported() and _core.testing.body_kernels_available()


needs_kernels = pytest.mark.skipif(not _core.testing.body_kernels_available(),
                                   reason="localspec's body kernels need x86-64 with AVX2")

N_OUT, N_IN = 72, 512  # 9 groups of 8 rows: uneven over 2 threads
# Widened to int8 for the head's kernel.
INT8_TYPES = ["q8_0", "q5_0", "q4_0"]
# ggml's block layouts: bytes per 256 values and where each block's fp16 scales sit.
K_TYPES = {"q4_K": (144, [0, 2]), "q5_K": (176, [0, 2]), "q6_K": (210, [208])}
# Multiplied by localspec's kernels, with x quantized as Q8_0; the rest by ggml's one-row dot
# product.
OWN_KERNELS = [*INT8_TYPES, "q4_K"]


def weights(type_name: str, rng: np.random.Generator) -> bytes:
    if type_name in INT8_TYPES:
        w = rng.standard_normal((N_OUT, N_IN)).astype(np.float32) * 0.05
        return quantize(w, GGMLQuantizationType[type_name.upper()]).tobytes()
    # K-quants: random integers and sub-block scales, sane fp16 super-block scales.
    block_bytes, scale_offsets = K_TYPES[type_name]
    n_blocks = N_OUT * N_IN // 256
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for offset in scale_offsets:
        scales = rng.uniform(1e-4, 1e-3, size=n_blocks).astype(np.float16)
        raw[:, offset:offset + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw.tobytes()


def product(type_name: str, w: bytes, x: np.ndarray, *, threads: int = 2,
            localspec: bool = True) -> np.ndarray:
    return np.asarray(_core.testing.body_matmul(type_name, w, N_OUT, N_IN, x, threads, localspec))


def reference(type_name: str, w: bytes, x: np.ndarray) -> np.ndarray:
    """W x in float64 from gguf-py's dequantized weights and x quantized as ggml's Q8_0 (what
    localspec's kernels multiply: only their order of float additions differs)."""
    qtype = GGMLQuantizationType[type_name.upper()]
    dense = dequantize(np.frombuffer(w, dtype=np.uint8).reshape(N_OUT, -1), qtype)
    xq = dequantize(quantize(x, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0)
    return xq.astype(np.float64) @ dense.astype(np.float64).T


@needs_kernels
@pytest.mark.parametrize("type_name", INT8_TYPES + list(K_TYPES))
def test_same_products(type_name: str) -> None:
    """localspec's kernels against the float64 product of the same quantized numbers, the
    one-row dot product against ggml's kernels: only the order of float additions may differ (a
    layout that misreads one bit of a block fails by orders of magnitude)."""
    rng = np.random.default_rng(1)
    w = weights(type_name, rng)
    x = rng.standard_normal((5, N_IN)).astype(np.float32)
    ours = product(type_name, w, x)
    expected = (reference(type_name, w, x) if type_name in OWN_KERNELS
                else product(type_name, w, x, localspec=False))
    assert ours.shape == (5, N_OUT)
    scale = np.abs(expected).max()
    assert scale > 0
    np.testing.assert_allclose(ours, expected, rtol=0, atol=scale * 1e-5)


@needs_kernels
@pytest.mark.parametrize("type_name", INT8_TYPES + list(K_TYPES))
def test_rows_are_batch_and_thread_invariant(type_name: str) -> None:
    """Each row of a 1 .. 16-row product has the bits of the same row in a 16-row product, on 1
    or 2 threads: what exact mode needs of every matrix in the body."""
    rng = np.random.default_rng(2)
    w = weights(type_name, rng)
    x = rng.standard_normal((16, N_IN)).astype(np.float32)
    full = product(type_name, w, x)
    for n_rows in range(1, 17):
        for threads in (1, 2):
            part = product(type_name, w, x[:n_rows], threads=threads)
            assert part.tobytes() == full[:n_rows].tobytes(), (n_rows, threads)


@needs_kernels
def test_ggml_own_rows_differ_with_the_batch() -> None:
    """The check above can fail: ggml's own tiled K-quant product sums 8+ rows in another order
    than 1 row (why exact mode needs these kernels or ggml's slower reference path)."""
    rng = np.random.default_rng(3)
    w = weights("q4_K", rng)
    x = rng.standard_normal((16, N_IN)).astype(np.float32)
    full = product("q4_K", w, x, localspec=False)
    one = np.concatenate([product("q4_K", w, x[j:j + 1], localspec=False) for j in range(16)])
    assert one.tobytes() != full.tobytes()
