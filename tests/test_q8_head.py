"""localspec's own Q8_0 output head (csrc/q8_head.*): the kernel against an independent numpy
computation of ggml's Q8_0 dot product, and the engine against llama.cpp's own head."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from localspec import _core
from localspec.engine import Engine
from localspec.types import GenerationParams, GenerationResult

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
@pytest.mark.parametrize("kernel", ["avx512vnni", "avxvnni"])
def test_kernel_matches_ggml_arithmetic(n_rows: int, kernel: str) -> None:
    if kernel not in _core.q8_head_kernels():
        pytest.skip(f"this CPU cannot run the {kernel} kernel")
    rng = np.random.default_rng(n_rows)
    n_vocab, n_embd = 1003, 96  # a vocabulary that is not a multiple of the 8-row groups
    blocks = q8_0_bytes(rng.standard_normal((n_vocab, n_embd)))
    hidden = (rng.standard_normal((n_rows, n_embd)) * 3).astype(np.float32)
    hidden[0, :32] = 0.0  # an all-zero block quantizes with d = 0
    expected = numpy_q8_0_logits(blocks, hidden)
    fast = _core.q8_head_logits(blocks, n_vocab, n_embd, hidden, kernel=kernel)
    reference = _core.q8_head_logits(blocks, n_vocab, n_embd, hidden, reference=True)
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
    one = _core.q8_head_logits(blocks, 4099, 64, hidden, n_threads=1)
    three = _core.q8_head_logits(blocks, 4099, 64, hidden, n_threads=3)
    assert np.array_equal(one, three)


@needs_vnni
@pytest.mark.parametrize("kernel", ["avx512vnni", "avxvnni"])
def test_a_row_gets_the_same_logits_in_every_batch_size(kernel: str) -> None:
    """Verification rows must equal plain decoding's single rows bit for bit: the tiles for
    different row counts split integer sums only, never the float accumulation."""
    if kernel not in _core.q8_head_kernels():
        pytest.skip(f"this CPU cannot run the {kernel} kernel")
    rng = np.random.default_rng(11)
    n_vocab, n_embd = 517, 128
    blocks = q8_0_bytes(rng.standard_normal((n_vocab, n_embd)))
    hidden = (rng.standard_normal((16, n_embd)) * 2).astype(np.float32)

    def logits(rows: np.ndarray) -> np.ndarray:
        return _core.q8_head_logits(blocks, n_vocab, n_embd, rows, kernel=kernel)

    alone = np.stack([logits(hidden[j:j + 1])[0] for j in range(16)])
    for n_rows in range(2, 17):
        batch = logits(hidden[:n_rows])
        assert np.array_equal(batch, alone[:n_rows]), n_rows


def test_kernel_rejects_wrong_sizes() -> None:
    blocks = np.zeros(34 * 2 * 10, dtype=np.uint8)
    with pytest.raises(ValueError):
        _core.q8_head_logits(blocks, 11, 64, np.zeros((1, 64), dtype=np.float32))
    if _core.q8_head_supported():
        good = np.zeros(34 * 2 * 11, dtype=np.uint8)
        with pytest.raises(ValueError, match="cannot run"):
            _core.q8_head_logits(good, 11, 64, np.zeros((1, 64), dtype=np.float32), kernel="nope")


@needs_vnni
def test_engine_uses_the_fast_head_only_where_it_applies(
    q8_head_model: Path, tiny_model_path: Path
) -> None:
    with Engine.load(q8_head_model, draft="ngram", n_ctx=512) as engine:
        assert engine.info.verify_head == "localspec-q8_0"
    with Engine.load(q8_head_model, draft="ngram", n_ctx=512, fast_head=False) as engine:
        assert engine.info.verify_head == "llama.cpp"
    with Engine.load(tiny_model_path, draft="ngram", n_ctx=512) as engine:  # an F32 head
        assert engine.info.verify_head == "llama.cpp"


@needs_vnni
def test_fast_head_logits_equal_llama_cpp_logits_for_the_same_batch(q8_head_model: Path) -> None:
    tokens = list(range(20, 60))
    logits = {}
    for fast in (True, False):
        with Engine.load(q8_head_model, draft="ngram", n_ctx=512, fast_head=fast) as engine:
            logits[fast] = {}
            for rows in (1, 2, 5, 8):
                logits[fast][rows] = engine.next_token_logits(tokens, rows)
                assert engine.last_logits_head() == ("localspec-q8_0" if fast else "llama.cpp")
    for rows in (1, 2, 5, 8):
        ours, theirs = logits[True][rows], logits[False][rows]
        assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()
        assert int(ours.argmax()) == int(theirs.argmax())


PROMPT = "the cat sat on the mat and the dog sat on the log. the cat sat on the"


def llama_cpp_plain(model: Path, greedy: GenerationParams) -> GenerationResult:
    """The reference: plain greedy decoding with llama.cpp's own head."""
    with Engine.load(model, draft="none", n_ctx=512, fast_head=False) as plain_engine:
        return plain_engine.generate(PROMPT, greedy)


@needs_vnni
def test_speculation_with_the_fast_head_is_lossless(q8_head_model: Path) -> None:
    prompt = PROMPT
    greedy = GenerationParams(max_tokens=48, temperature=0.0, ignore_eos=True, reuse_cache=False)
    plain = llama_cpp_plain(q8_head_model, greedy)
    with Engine.load(q8_head_model, draft="none", n_ctx=512) as fast_plain_engine:
        fast_plain = fast_plain_engine.generate(prompt, greedy)  # plain decoding, our head
        assert fast_plain_engine.last_logits_head() == "localspec-q8_0"
    assert fast_plain.tokens == plain.tokens
    with Engine.load(q8_head_model, draft="ngram", n_ctx=512) as engine:
        for draft_max in (1, 3, 8):
            spec = engine.generate(prompt, replace(greedy, draft_max=draft_max))
            assert spec.tokens == plain.tokens
            assert spec.stats.drafted > 0


@needs_vnni
def test_fast_head_rows_of_a_prompt_longer_than_one_batch(q8_head_model: Path) -> None:
    # n_batch is 2048: the decode runs in two pieces and only the last one asks for logits.
    tokens = [20 + (i * 7) % 300 for i in range(2100)]
    logits = {}
    for fast in (True, False):
        with Engine.load(q8_head_model, draft="ngram", n_ctx=4096, fast_head=fast) as engine:
            logits[fast] = engine.next_token_logits(tokens, 4)
            assert engine.last_logits_head() == ("localspec-q8_0" if fast else "llama.cpp")
    assert np.abs(logits[True] - logits[False]).max() <= 1e-5 * np.abs(logits[False]).max()


@needs_vnni
def test_rows_beyond_one_graph_keep_llama_cpp_s_head(q8_head_model: Path) -> None:
    # 600 rows with logits: llama.cpp splits them over two graphs (n_ubatch 512), which the
    # hook cannot stitch together, so llama.cpp's head computes them.
    tokens = [20 + (i * 7) % 300 for i in range(700)]
    with Engine.load(q8_head_model, draft="ngram", n_ctx=1024) as engine:
        fast = engine.next_token_logits(tokens, 600)
        assert engine.last_logits_head() == "llama.cpp"
        again = engine.next_token_logits(tokens, 4)
        assert engine.last_logits_head() == "localspec-q8_0"
    with Engine.load(q8_head_model, draft="ngram", n_ctx=1024, fast_head=False) as engine:
        theirs = engine.next_token_logits(tokens, 600)
        theirs_4 = engine.next_token_logits(tokens, 4)
    assert np.array_equal(fast, theirs)
    assert np.abs(again - theirs_4).max() <= 1e-5 * np.abs(theirs_4).max()


@needs_vnni
def test_a_draft_model_with_a_q8_0_head_uses_localspec_s_head(q8_head_model: Path) -> None:
    prompt = PROMPT
    greedy = GenerationParams(max_tokens=32, temperature=0.0, ignore_eos=True, reuse_cache=False)
    plain = llama_cpp_plain(q8_head_model, greedy)
    with Engine.load(q8_head_model, draft=q8_head_model, n_ctx=512) as engine:
        assert engine.info.draft_head == "localspec-q8_0"
        spec = engine.generate(prompt, replace(greedy, draft_max=3))
    assert spec.tokens == plain.tokens
    # The draft is the target itself: its drafts are the target's own argmaxes.
    assert spec.stats.drafted > 0 and spec.stats.accepted == spec.stats.drafted
    with Engine.load(q8_head_model, draft=q8_head_model, n_ctx=512, fast_head=False) as engine:
        assert engine.info.draft_head == "llama.cpp"
    with Engine.load(q8_head_model, draft="ngram", n_ctx=512) as engine:
        assert engine.info.draft_head == ""
