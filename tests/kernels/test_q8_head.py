"""localspec's own Q8_0 output head (csrc/kernels/q8_head.*): the kernel against an independent
numpy
computation of ggml's Q8_0 dot product (the engine with it: test_output_heads.py)."""

from __future__ import annotations

import numpy as np
import pytest

from localspec import _core

needs_vnni = pytest.mark.skipif(
    not _core.q8_head_supported(), reason="the Q8_0 head needs AVX-VNNI or AVX512-VNNI"
)


def q8_0_bytes(rows: np.ndarray) -> np.ndarray:
    """ggml's Q8_0 layout: per 32 values an fp16 scale then 32 int8 values."""
    import gguf

    return gguf.quants.quantize(rows.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)


def numpy_q8_0_logits(blocks: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    """Written from ggml's definition, independently of the C++: hidden rows quantized per
    32 values (d = max|x|/127 as fp16, q = round-half-even(x*127/max|x|)), integer block dot
    products, then sum of d_w * d_x * isum."""
    n_vocab, n_embd = blocks.shape[0], hidden.shape[1]
    nb = n_embd // 32
    raw = blocks.reshape(n_vocab, nb, 34)
    d_w = raw[:, :, :2].copy().view(np.float16)[:, :, 0].astype(np.float64)
    q_w = raw[:, :, 2:].copy().view(np.int8).astype(np.int64)
    x = hidden.reshape(len(hidden), nb, 32).astype(np.float32)
    amax = np.abs(x).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q_x = np.rint(x * inv).astype(np.int64)
    d_x = (amax[:, :, 0] / np.float32(127)).astype(np.float16).astype(np.float64)
    isum = np.einsum("vbi,jbi->jvb", q_w, q_x)
    return np.einsum("jvb,vb,jb->jv", isum.astype(np.float64), d_w, d_x)


@needs_vnni
@pytest.mark.parametrize("n_rows", [1, 2, 3, 4, 5, 8, 9, 16])
@pytest.mark.parametrize("kernel", ["avx512vnni", "avxvnni", "avx2"])
def test_kernel_matches_ggml_arithmetic(n_rows: int, kernel: str) -> None:
    if kernel not in _core.testing.q8_head_kernels():
        pytest.skip(f"this CPU cannot run the {kernel} kernel")
    rng = np.random.default_rng(n_rows)
    n_vocab, n_embd = 1003, 96  # a vocabulary that is not a multiple of the 8-row groups
    blocks = q8_0_bytes(rng.standard_normal((n_vocab, n_embd)))
    hidden = (rng.standard_normal((n_rows, n_embd)) * 3).astype(np.float32)
    hidden[0, :32] = 0.0  # an all-zero block quantizes with d = 0
    expected = numpy_q8_0_logits(blocks, hidden)
    fast = _core.testing.q8_head_logits(blocks, n_vocab, n_embd, hidden, kernel=kernel)
    reference = _core.testing.q8_head_logits(blocks, n_vocab, n_embd, hidden, reference=True)
    assert fast.shape == (n_rows, n_vocab)
    scale = np.abs(expected).max()
    # Only float summation order differs: float32 rounding, far below any real logit gap.
    assert np.abs(fast - expected).max() <= 1e-5 * scale
    assert np.abs(reference - expected).max() <= 1e-5 * scale


@needs_vnni
def test_kernel_threads_split_the_vocabulary_exactly() -> None:
    rng = np.random.default_rng(7)
    blocks = q8_0_bytes(rng.standard_normal((4099, 64)))
    hidden = rng.standard_normal((6, 64)).astype(np.float32)
    one = _core.testing.q8_head_logits(blocks, 4099, 64, hidden, n_threads=1)
    three = _core.testing.q8_head_logits(blocks, 4099, 64, hidden, n_threads=3)
    assert np.array_equal(one, three)


@needs_vnni
@pytest.mark.parametrize("kernel", ["avx512vnni", "avxvnni", "avx2"])
def test_a_row_gets_the_same_logits_in_every_batch_size(kernel: str) -> None:
    """Verification rows must equal plain decoding's single rows bit for bit: the tiles for
    different row counts split integer sums only, never the float accumulation."""
    if kernel not in _core.testing.q8_head_kernels():
        pytest.skip(f"this CPU cannot run the {kernel} kernel")
    rng = np.random.default_rng(11)
    n_vocab, n_embd = 517, 128
    blocks = q8_0_bytes(rng.standard_normal((n_vocab, n_embd)))
    hidden = (rng.standard_normal((16, n_embd)) * 2).astype(np.float32)

    def logits(rows: np.ndarray) -> np.ndarray:
        return _core.testing.q8_head_logits(blocks, n_vocab, n_embd, rows, kernel=kernel)

    alone = np.stack([logits(hidden[j:j + 1])[0] for j in range(16)])
    for n_rows in range(2, 17):
        batch = logits(hidden[:n_rows])
        assert np.array_equal(batch, alone[:n_rows]), n_rows


def test_kernel_rejects_wrong_sizes() -> None:
    blocks = np.zeros(34 * 2 * 10, dtype=np.uint8)
    with pytest.raises(ValueError):
        _core.testing.q8_head_logits(blocks, 11, 64, np.zeros((1, 64), dtype=np.float32))
    if _core.q8_head_supported():
        good = np.zeros(34 * 2 * 11, dtype=np.uint8)
        with pytest.raises(ValueError, match="cannot run"):
            _core.testing.q8_head_logits(good, 11, 64, np.zeros((1, 64), dtype=np.float32),
                                         kernel="nope")


def small_q8_0_bytes(rng: np.random.Generator, n_vocab: int, n_embd: int) -> np.ndarray:
    """Q8_0 blocks whose values all lie in -16..15, as Q5_0 weights widen."""
    blocks = q8_0_bytes(rng.standard_normal((n_vocab, n_embd))).reshape(n_vocab, -1, 34).copy()
    values = rng.integers(-16, 16, size=(n_vocab, n_embd // 32, 32)).astype(np.int8)
    blocks[:, :, 2:] = values.view(np.uint8)
    return blocks.reshape(n_vocab, -1)


@needs_vnni
@pytest.mark.parametrize("n_rows", [1, 3, 4, 7])
@pytest.mark.parametrize("kernel", ["avx512vnni", "avxvnni", "avx2"])
def test_small_weights_take_a_shorter_path_to_the_same_bits(n_rows: int, kernel: str) -> None:
    """Weights within -16..15 (Q5_0 and Q4_0 widened) let AVX2 skip its sign trick. The other
    path's block sums are the same integers: one value of 100 in the last vocabulary row sends
    the whole head down the signed path, and every other row's logits keep their bits; both
    match ggml's arithmetic."""
    if kernel not in _core.testing.q8_head_kernels():
        pytest.skip(f"this CPU cannot run the {kernel} kernel")
    rng = np.random.default_rng(n_rows + 40)
    n_vocab, n_embd = 203, 128
    small = small_q8_0_bytes(rng, n_vocab, n_embd)
    large = small.copy()
    large[-1, 2] = 100  # the first value of the last row's first block
    hidden = (rng.standard_normal((n_rows, n_embd)) * 3).astype(np.float32)
    fast = _core.testing.q8_head_logits(small, n_vocab, n_embd, hidden, kernel=kernel)
    signed = _core.testing.q8_head_logits(large, n_vocab, n_embd, hidden, kernel=kernel)
    assert np.array_equal(fast[:, :-1], signed[:, :-1])
    expected = numpy_q8_0_logits(small, hidden)
    assert np.abs(fast - expected).max() <= 1e-5 * np.abs(expected).max()
    assert np.abs(signed - numpy_q8_0_logits(large, hidden)).max() <= 1e-5 * np.abs(expected).max()
