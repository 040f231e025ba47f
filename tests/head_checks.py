"""Engine-level checks shared by the tests of localspec's output heads (test_q8_head.py,
test_f16_head.py): the same logits as llama.cpp's own head, and lossless speculation."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from localspec.engine import Engine
from localspec.types import GenerationParams


def check_logits_match_llama_cpp(model: Path, head: str) -> None:
    """For batches of 1 to 8 rows, `head` computes the rows, and they equal llama.cpp's own
    head's to float rounding, with the same argmax."""
    tokens = list(range(20, 60))
    logits: dict[bool, dict[int, np.ndarray]] = {}
    for fast in (True, False):
        with Engine.load(model, draft="ngram", n_ctx=512, fast_head=fast) as engine:
            assert engine.info.verify_head == (head if fast else "llama.cpp")
            logits[fast] = {}
            for rows in (1, 2, 5, 8):
                logits[fast][rows] = engine.next_token_logits(tokens, rows)
                assert engine.last_logits_head() == (head if fast else "llama.cpp")
    for rows in (1, 2, 5, 8):
        ours, theirs = logits[True][rows], logits[False][rows]
        assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()
        assert int(ours.argmax()) == int(theirs.argmax())


def check_speculation_lossless(model: Path, head: str) -> None:
    """Plain decoding and greedy speculation with `head` both give llama.cpp's plain output."""
    prompt = "the cat sat on the mat and the dog sat on the log. the cat sat on the"
    greedy = GenerationParams(max_tokens=48, temperature=0.0, ignore_eos=True, reuse_cache=False)
    with Engine.load(model, draft="none", n_ctx=512, fast_head=False) as plain_engine:
        plain = plain_engine.generate(prompt, greedy)
    with Engine.load(model, draft="none", n_ctx=512) as fast_plain_engine:
        fast_plain = fast_plain_engine.generate(prompt, greedy)  # plain decoding, our head
        assert fast_plain_engine.last_logits_head() == head
    assert fast_plain.tokens == plain.tokens
    with Engine.load(model, draft="ngram", n_ctx=512) as engine:
        for draft_max in (1, 3, 8):
            spec = engine.generate(prompt, replace(greedy, draft_max=draft_max))
            assert spec.tokens == plain.tokens
            assert spec.stats.drafted > 0
