"""localspec's F16 and BF16 output head (csrc/f16_head.*): the kernel against numpy, and in the
engine against llama.cpp's own head on real (tiny) GGUFs whose heads are F16 and BF16."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localspec import _core
from tests.head_checks import check_logits_match_llama_cpp, check_speculation_lossless

needs_f16c = pytest.mark.skipif(
    not _core.f16_head_supported(), reason="the F16 head needs AVX2, FMA and F16C"
)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even (as ggml's ggml_compute_fp32_to_bf16)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(h: np.ndarray) -> np.ndarray:
    return (h.astype(np.uint32) << 16).view(np.float32)


@needs_f16c
@pytest.mark.parametrize("n_rows", [1, 2, 3, 4, 5, 7, 8, 9, 16])
@pytest.mark.parametrize("bf16", [False, True])
def test_kernel_matches_ggml_arithmetic(n_rows: int, bf16: bool) -> None:
    """ggml rounds the hidden states to the weights' 16-bit format, then multiplies and adds
    in float: the same products; only the order of the additions may differ."""
    rng = np.random.default_rng(n_rows)
    n_vocab, n_embd = 1003, 98  # not a multiple of the 8-row groups, nor of 4 columns
    raw = rng.standard_normal((n_vocab, n_embd)).astype(np.float32)
    hidden = (rng.standard_normal((n_rows, n_embd)) * 3).astype(np.float32)
    if bf16:
        bits = to_bf16(raw)
        weights = from_bf16(bits)
        rounded = from_bf16(to_bf16(hidden))
    else:
        bits = raw.astype(np.float16).view(np.uint16)
        weights = raw.astype(np.float16).astype(np.float32)
        rounded = hidden.astype(np.float16).astype(np.float32)
    expected = rounded.astype(np.float64) @ weights.astype(np.float64).T
    ours = _core.f16_head_logits(bits, hidden, bf16=bf16)
    assert ours.shape == (n_rows, n_vocab)
    assert np.abs(ours - expected).max() <= 1e-5 * np.abs(expected).max()
    # Rounding the hidden states is part of the arithmetic: without it the error is orders
    # of magnitude larger than float rounding.
    unrounded = hidden.astype(np.float64) @ weights.astype(np.float64).T
    assert np.abs(unrounded - expected).max() > 1e-4 * np.abs(expected).max()


@needs_f16c
def test_kernel_threads_split_the_vocabulary_exactly() -> None:
    rng = np.random.default_rng(3)
    weights = rng.standard_normal((4099, 64)).astype(np.float16).view(np.uint16)
    hidden = rng.standard_normal((6, 64)).astype(np.float32)
    one = _core.f16_head_logits(weights, hidden, n_threads=1)
    three = _core.f16_head_logits(weights, hidden, n_threads=3)
    assert np.array_equal(one, three)


@needs_f16c
def test_engine_logits_equal_llama_cpp_logits(f16_head_model: Path) -> None:
    check_logits_match_llama_cpp(f16_head_model, "localspec-f16")


@needs_f16c
def test_speculation_with_the_f16_head_is_lossless(f16_head_model: Path) -> None:
    check_speculation_lossless(f16_head_model, "localspec-f16")


@needs_f16c
def test_engine_bf16_logits_equal_llama_cpp_logits(bf16_head_model: Path) -> None:
    check_logits_match_llama_cpp(bf16_head_model, "localspec-bf16")


@needs_f16c
def test_speculation_with_the_bf16_head_is_lossless(bf16_head_model: Path) -> None:
    check_speculation_lossless(bf16_head_model, "localspec-bf16")
