"""localspec's own Q6_K output head (csrc/kernels/q6k_head.*): the kernel against an independent
numpy
computation of ggml's Q6_K x Q8_K dot product, and the engine against llama.cpp's own head on
a model whose head llama.cpp's quantizer made Q6_K."""

from __future__ import annotations

import numpy as np
import pytest

from localspec import _core

BLOCK = 210  # ql[128] qh[64] scales[16] d (fp16)


def random_q6_k(rng: np.random.Generator, n_rows: int, n_embd: int) -> np.ndarray:
    """Random but valid Q6_K rows: any bits are a block; d is a finite fp16."""
    blocks = rng.integers(0, 256, size=(n_rows, n_embd // 256, BLOCK), dtype=np.uint8)
    d = (rng.standard_normal((n_rows, n_embd // 256)) * 1e-3).astype(np.float16)
    blocks[:, :, 208:] = d.view(np.uint8).reshape(n_rows, n_embd // 256, 2)
    return blocks.reshape(-1)


def numpy_q6_k_logits(raw: np.ndarray, n_vocab: int, n_embd: int, hidden: np.ndarray) -> np.ndarray:
    """Written from ggml's definitions, independently of the C++ (dequantize_row_q6_K,
    quantize_row_q8_K_ref, ggml_vec_dot_q6_K_q8_K's integer sums)."""
    ns = n_embd // 256
    b = raw.reshape(n_vocab, ns, BLOCK).astype(np.int64)
    ql, qh = b[:, :, :128], b[:, :, 128:192]
    scales = raw.reshape(n_vocab, ns, BLOCK)[:, :, 192:208].view(np.int8).astype(np.int64)
    d_w = raw.reshape(n_vocab, ns, BLOCK)[:, :, 208:210].copy().view(np.float16)[:, :, 0]
    q = np.empty((n_vocab, ns, 256), dtype=np.int64)
    for half in range(2):
        lo, hi = ql[:, :, 64 * half:64 * half + 64], qh[:, :, 32 * half:32 * half + 32]
        out = 128 * half
        q[:, :, out:out + 32] = (lo[:, :, :32] & 0xF) | (((hi >> 0) & 3) << 4)
        q[:, :, out + 32:out + 64] = (lo[:, :, 32:] & 0xF) | (((hi >> 2) & 3) << 4)
        q[:, :, out + 64:out + 96] = (lo[:, :, :32] >> 4) | (((hi >> 4) & 3) << 4)
        q[:, :, out + 96:out + 128] = (lo[:, :, 32:] >> 4) | (((hi >> 6) & 3) << 4)
    w = q - 32
    x = hidden.reshape(len(hidden), ns, 256).astype(np.float32)
    first_max = np.abs(x).argmax(axis=2)
    signed_max = np.take_along_axis(x, first_max[:, :, None], axis=2)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(signed_max != 0, np.float32(-127) / signed_max, np.float32(0))
    q_x = np.minimum(np.rint(x * iscale.astype(np.float32)), 127).astype(np.int64)
    with np.errstate(divide="ignore"):
        d_x = np.where(iscale[:, :, 0] != 0, np.float32(1) / iscale[:, :, 0], np.float32(0))
    sub = np.einsum("vsjk,rsjk->rvsj", w.reshape(n_vocab, ns, 16, 16), q_x.reshape(-1, ns, 16, 16))
    isum = (sub * scales[None]).sum(axis=3)  # [row][vocab][super]
    return np.einsum("rvs,vs,rs->rv", isum.astype(np.float64), d_w.astype(np.float64),
                     d_x.astype(np.float64))


needs_vnni = pytest.mark.skipif(not _core.testing.q8_head_kernels(),
                                reason="localspec's heads need AVX-VNNI or AVX512-VNNI")


@needs_vnni
@pytest.mark.parametrize("n_rows", [1, 2, 3, 5, 8, 9, 16])
@pytest.mark.parametrize("kernel", ["avx512vnni", "avxvnni", "avx2"])
def test_kernel_matches_ggml_arithmetic(n_rows: int, kernel: str) -> None:
    if kernel not in _core.testing.q8_head_kernels():
        pytest.skip(f"this CPU cannot run the {kernel} kernel")
    rng = np.random.default_rng(n_rows)
    n_vocab, n_embd = 203, 512  # a vocabulary that is not a multiple of the 8-row groups
    raw = random_q6_k(rng, n_vocab, n_embd)
    hidden = (rng.standard_normal((n_rows, n_embd)) * 3).astype(np.float32)
    hidden[0, :256] = 0.0  # an all-zero super-block quantizes with d = 0
    expected = numpy_q6_k_logits(raw, n_vocab, n_embd, hidden)
    fast = _core.testing.q6k_head_logits(raw, n_vocab, n_embd, hidden, kernel=kernel)
    reference = _core.testing.q6k_head_logits(raw, n_vocab, n_embd, hidden, reference=True)
    scale = np.abs(expected).max()
    assert fast.shape == (n_rows, n_vocab)
    assert np.abs(fast - expected).max() <= 1e-5 * scale
    assert np.abs(reference - expected).max() <= 1e-5 * scale


@needs_vnni
def test_a_row_gets_the_same_logits_in_every_batch_size() -> None:
    rng = np.random.default_rng(3)
    n_vocab, n_embd = 77, 256
    raw = random_q6_k(rng, n_vocab, n_embd)
    hidden = rng.standard_normal((12, n_embd)).astype(np.float32)
    alone = np.stack([_core.testing.q6k_head_logits(raw, n_vocab, n_embd, hidden[j:j + 1])[0]
                      for j in range(12)])
    for n_rows in range(2, 13):
        batch = _core.testing.q6k_head_logits(raw, n_vocab, n_embd, hidden[:n_rows])
        assert np.array_equal(batch, alone[:n_rows]), n_rows


def test_kernel_rejects_wrong_sizes() -> None:
    with pytest.raises(ValueError):
        _core.testing.q6k_head_logits(np.zeros(BLOCK * 3, np.uint8), 3, 128,
                                      np.zeros(128, np.float32))
    with pytest.raises(ValueError):
        _core.testing.q6k_head_logits(np.zeros(BLOCK * 2, np.uint8), 3, 256,
                                      np.zeros(256, np.float32))
