"""localspec's output heads in the engine (Q8_0: csrc/kernels/q8_head.*, Q6_K:
csrc/kernels/q6k_head.*): each is
used exactly where it applies, gives llama.cpp's logits for the same batch, and keeps greedy
speculation identical to llama.cpp's own plain decoding. The heads are CPU kernels: every engine
keeps its layers on the CPU (n_gpu_layers=0), so the tests hold in GPU builds too."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from localspec import _core
from localspec.runtime.engine import Engine
from localspec.types import GenerationParams, GenerationResult

pytestmark = pytest.mark.skipif(not _core.testing.q8_head_kernels(),
                                reason="localspec's heads need AVX-VNNI or AVX512-VNNI")

HEADS = {"q8_0": "q8_head_model", "q6_k": "q6k_head_model"}  # head type -> model fixture


@pytest.fixture(params=sorted(HEADS))
def head(request: pytest.FixtureRequest) -> tuple[str, Path]:
    """(the head's name in Engine.info, a tiny model whose output head has that type)."""
    return f"localspec-{request.param}", request.getfixturevalue(HEADS[request.param])


def test_engine_uses_the_fast_head_only_where_it_applies(head: tuple[str, Path],
                                                         tiny_model_path: Path) -> None:
    name, model = head
    with Engine.load(model, draft="ngram", n_ctx=512, n_gpu_layers=0) as engine:
        assert engine.info.verify_head == name
    with Engine.load(model, draft="ngram", n_ctx=512, n_gpu_layers=0, fast_head=False) as engine:
        assert engine.info.verify_head == "llama.cpp"
    # an F32 head
    with Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_gpu_layers=0) as engine:
        assert engine.info.verify_head == "llama.cpp"


def test_fast_head_logits_equal_llama_cpp_logits_for_the_same_batch(head: tuple[str, Path]) -> None:
    name, model = head
    tokens = list(range(20, 60))
    logits = {}
    for fast in (True, False):
        with Engine.load(model, draft="ngram", n_ctx=512, n_gpu_layers=0, fast_head=fast) as engine:
            logits[fast] = {}
            for rows in (1, 2, 5, 8):
                logits[fast][rows] = engine.next_token_logits(tokens, rows)
                assert engine.last_logits_head() == (name if fast else "llama.cpp")
    for rows in (1, 2, 5, 8):
        ours, theirs = logits[True][rows], logits[False][rows]
        assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()
        assert int(ours.argmax()) == int(theirs.argmax())


PROMPT = "the cat sat on the mat and the dog sat on the log. the cat sat on the"


def llama_cpp_plain(model: Path, greedy: GenerationParams) -> GenerationResult:
    """The reference: plain greedy decoding with llama.cpp's own head."""
    with Engine.load(model, draft="none", n_ctx=512, n_gpu_layers=0,
                     fast_head=False) as plain_engine:
        return plain_engine.generate(PROMPT, greedy)


def test_speculation_with_the_fast_head_is_lossless(head: tuple[str, Path]) -> None:
    name, model = head
    greedy = GenerationParams(max_tokens=48, temperature=0.0, ignore_eos=True, reuse_cache=False)
    plain = llama_cpp_plain(model, greedy)
    with Engine.load(model, draft="none", n_ctx=512, n_gpu_layers=0) as fast_plain_engine:
        fast_plain = fast_plain_engine.generate(PROMPT, greedy)  # plain decoding, our head
        assert fast_plain_engine.last_logits_head() == name
    assert fast_plain.tokens == plain.tokens
    with Engine.load(model, draft="ngram", n_ctx=512, n_gpu_layers=0) as engine:
        for draft_max in (1, 3, 8):
            spec = engine.generate(PROMPT, replace(greedy, draft_max=draft_max))
            assert spec.tokens == plain.tokens
            assert spec.stats.drafted > 0


def test_fast_head_rows_of_a_prompt_longer_than_one_batch(head: tuple[str, Path]) -> None:
    # n_batch is 2048: the decode runs in two pieces and only the last one asks for logits.
    name, model = head
    tokens = [20 + (i * 7) % 300 for i in range(2100)]
    logits = {}
    for fast in (True, False):
        with Engine.load(model, draft="ngram", n_ctx=4096, n_gpu_layers=0,
                         fast_head=fast) as engine:
            logits[fast] = engine.next_token_logits(tokens, 4)
            assert engine.last_logits_head() == (name if fast else "llama.cpp")
    assert np.abs(logits[True] - logits[False]).max() <= 1e-5 * np.abs(logits[False]).max()


def test_rows_beyond_one_graph_keep_llama_cpp_s_head(head: tuple[str, Path]) -> None:
    # 600 rows with logits: llama.cpp splits them over two graphs (n_ubatch 512), which the
    # hook cannot stitch together, so llama.cpp's head computes them.
    name, model = head
    tokens = [20 + (i * 7) % 300 for i in range(700)]
    with Engine.load(model, draft="ngram", n_ctx=1024, n_gpu_layers=0) as engine:
        fast = engine.next_token_logits(tokens, 600)
        assert engine.last_logits_head() == "llama.cpp"
        again = engine.next_token_logits(tokens, 4)
        assert engine.last_logits_head() == name
    with Engine.load(model, draft="ngram", n_ctx=1024, n_gpu_layers=0, fast_head=False) as engine:
        theirs = engine.next_token_logits(tokens, 600)
        theirs_4 = engine.next_token_logits(tokens, 4)
    assert np.array_equal(fast, theirs)
    assert np.abs(again - theirs_4).max() <= 1e-5 * np.abs(theirs_4).max()


def test_a_draft_model_with_a_supported_head_uses_localspec_s_head(head: tuple[str, Path]) -> None:
    name, model = head
    greedy = GenerationParams(max_tokens=32, temperature=0.0, ignore_eos=True, reuse_cache=False)
    plain = llama_cpp_plain(model, greedy)
    with Engine.load(model, draft=model, n_ctx=512, n_gpu_layers=0) as engine:
        assert engine.info.draft_head == name
        spec = engine.generate(PROMPT, replace(greedy, draft_max=3))
    assert spec.tokens == plain.tokens
    # The draft is the target itself: its drafts are the target's own argmaxes.
    assert spec.stats.drafted > 0 and spec.stats.accepted == spec.stats.drafted
    with Engine.load(model, draft=model, n_ctx=512, n_gpu_layers=0, fast_head=False) as engine:
        assert engine.info.draft_head == "llama.cpp"
    with Engine.load(model, draft="ngram", n_ctx=512, n_gpu_layers=0) as engine:
        assert engine.info.draft_head == ""


def test_a_reduced_draft_vocabulary_drafts_below_it_alone_and_stays_lossless(
        head: tuple[str, Path]) -> None:
    """draft_vocab (FR-Spec): the draft model's head computes the first N token ids alone, so it
    never drafts a token above them; the target's correction still emits any token, and greedy
    output stays the plain output. The draft is the target itself: with its whole vocabulary
    hardly a draft is rejected (a near-tie of two heads' sums at most), with 256 of its 380 ids
    the drafts miss where the target's token is above them (no confidence cutoff: every draft
    runs its full length)."""
    _, model = head
    greedy = GenerationParams(max_tokens=48, temperature=0.0, ignore_eos=True, reuse_cache=False,
                              draft_max=3)
    plain = llama_cpp_plain(model, greedy)
    assert any(t >= 256 for t in plain.tokens)
    with Engine.load(model, draft=model, n_ctx=512, n_gpu_layers=0, draft_vocab=256,
                     draft_p_min=0.0) as engine:
        spec = engine.generate(PROMPT, greedy)
    assert spec.tokens == plain.tokens
    assert spec.stats.accepted > 0 and spec.stats.rejected >= 10
    with Engine.load(model, draft=model, n_ctx=512, n_gpu_layers=0, draft_p_min=0.0) as engine:
        whole = engine.generate(PROMPT, greedy)
    assert whole.tokens == plain.tokens and whole.stats.rejected <= 2
