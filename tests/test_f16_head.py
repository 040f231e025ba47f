"""localspec's F16 output head (csrc/f16_head.*): the kernel against numpy, and in the engine
against llama.cpp's own head on a real (tiny) GGUF whose head is F16."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from localspec import _core
from localspec.engine import Engine
from localspec.types import GenerationParams

needs_f16c = pytest.mark.skipif(
    not _core.f16_head_supported(), reason="the F16 head needs AVX2, FMA and F16C"
)


@needs_f16c
@pytest.mark.parametrize("n_rows", [1, 2, 3, 4, 5, 7, 8, 9, 16])
def test_kernel_matches_ggml_arithmetic(n_rows: int) -> None:
    """ggml rounds the hidden states to fp16, then multiplies and adds in float: the same
    products; only the order of the additions may differ."""
    rng = np.random.default_rng(n_rows)
    n_vocab, n_embd = 1003, 98  # not a multiple of the 8-row groups, nor of 4 columns
    weights = rng.standard_normal((n_vocab, n_embd)).astype(np.float16)
    hidden = (rng.standard_normal((n_rows, n_embd)) * 3).astype(np.float32)
    expected = hidden.astype(np.float16).astype(np.float64) @ weights.astype(np.float64).T
    ours = _core.f16_head_logits(weights.view(np.uint16), hidden)
    assert ours.shape == (n_rows, n_vocab)
    assert np.abs(ours - expected).max() <= 1e-5 * np.abs(expected).max()
    # Rounding the hidden states to fp16 is part of the arithmetic: without it the error is
    # orders of magnitude larger than float rounding.
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
    tokens = list(range(20, 60))
    logits = {}
    for fast in (True, False):
        with Engine.load(f16_head_model, draft="ngram", n_ctx=512, fast_head=fast) as engine:
            assert engine.info.verify_head == ("localspec-f16" if fast else "llama.cpp")
            logits[fast] = {}
            for rows in (1, 2, 5, 8):
                logits[fast][rows] = engine.next_token_logits(tokens, rows)
                assert engine.last_logits_head() == ("localspec-f16" if fast else "llama.cpp")
    for rows in (1, 2, 5, 8):
        ours, theirs = logits[True][rows], logits[False][rows]
        assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()
        assert int(ours.argmax()) == int(theirs.argmax())


@needs_f16c
def test_speculation_with_the_f16_head_is_lossless(f16_head_model: Path) -> None:
    prompt = "the cat sat on the mat and the dog sat on the log. the cat sat on the"
    greedy = GenerationParams(max_tokens=48, temperature=0.0, ignore_eos=True, reuse_cache=False)
    with Engine.load(f16_head_model, draft="none", n_ctx=512, fast_head=False) as plain_engine:
        plain = plain_engine.generate(prompt, greedy)
    with Engine.load(f16_head_model, draft="ngram", n_ctx=512) as engine:
        for draft_max in (1, 3, 8):
            spec = engine.generate(prompt, replace(greedy, draft_max=draft_max))
            assert spec.tokens == plain.tokens
            assert spec.stats.drafted > 0
