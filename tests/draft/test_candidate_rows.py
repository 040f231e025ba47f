"""Verification rows at the grammar's candidates (Draft::row_candidates): where the grammar forces
text, a row's logits are computed at the few tokens it can allow there, not over the whole
vocabulary, and the output is still exactly the constrained target's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from localspec import _core
from localspec.runtime.engine import Engine
from localspec.types import GenerationParams
from tests.draft.test_forced_drafting import (
    GBNF,
    assert_first_tokens_follow_the_constrained_target,
    sample_forced_words,
)
from tests.kernels.test_q6k_head import random_q6_k
from tests.kernels.test_q8_head import q8_0_bytes
from tests.text.test_structured import PROMPT, SCHEMA

pytestmark = pytest.mark.skipif(not _core.q8_head_supported(),
                                reason="the Q8_0 head needs AVX2, AVX-VNNI or AVX512-VNNI")


@pytest.mark.parametrize("head", ["q8", "q6k"])
def test_logits_at_chosen_tokens_are_the_whole_rows_bits(head: str) -> None:
    rng = np.random.default_rng(3)
    n_vocab = 1003  # the last 8-row group is partial
    n_embd = 96 if head == "q8" else 256
    blocks = (q8_0_bytes(rng.standard_normal((n_vocab, n_embd))) if head == "q8"
              else random_q6_k(rng, n_vocab, n_embd))
    hidden = (rng.standard_normal((1, n_embd)) * 3).astype(np.float32)
    whole = getattr(_core.testing, f"{head}_head_logits")(blocks, n_vocab, n_embd, hidden)[0]
    ids = [0, 7, 8, 9, 500, 501, 999, 1000, 1002, 9]
    at = getattr(_core.testing, f"{head}_head_logits_at")
    chosen = np.array(at(blocks, n_vocab, n_embd, hidden[0], ids), dtype=np.float32)
    assert chosen.view(np.uint32).tolist() == whole[ids].view(np.uint32).tolist()


def test_candidates_hold_every_token_the_grammar_allows(tiny_model_path: Path) -> None:
    """Along a constrained output, wherever text is forced, the candidates of that text (and of
    what is left of it after each forced token) contain every token the grammar allows."""
    path = str(tiny_model_path)
    with Engine.load(tiny_model_path, draft="none", n_ctx=512) as engine:
        greedy = GenerationParams(temperature=0.0, max_tokens=60, grammar=GBNF)
        out = engine.generate(PROMPT, greedy)
    checked = several_allowed = 0
    for n in range(len(out.tokens)):
        done = out.tokens[:n]
        forced = _core.testing.forced_text(path, GBNF, done, 64).decode()
        if not forced:
            continue
        candidates, allowed = _core.testing.forced_candidates(path, GBNF, done, forced, 10_000)
        assert allowed and set(allowed) <= set(candidates), (forced, allowed, candidates)
        checked += 1
        several_allowed += len(allowed) > 1
    assert checked >= 4 and several_allowed >= 1  # more than one tokenization was possible


def test_too_many_candidates_give_a_whole_row(tiny_model_path: Path) -> None:
    path = str(tiny_model_path)
    candidates, _ = _core.testing.forced_candidates(path, GBNF, [], " ", 10_000)  # " the", ...
    assert len(candidates) > 1
    assert _core.testing.forced_candidates(path, GBNF, [], " ", len(candidates))[0] == candidates
    assert _core.testing.forced_candidates(path, GBNF, [], " ", len(candidates) - 1)[0] == []


def load_pair(model: Path) -> dict[str, Engine]:
    # On the CPU: localspec's heads are CPU kernels, and a GPU build would give the head to
    # llama.cpp with the layers.
    return {d: Engine.load(model, draft=d, n_ctx=1024, n_gpu_layers=0) for d in ("none", "ngram")}


@pytest.fixture(scope="module")
def q8_engines(q8_head_model: Path):
    loaded = load_pair(q8_head_model)
    yield loaded
    for engine in loaded.values():
        engine.close()


@pytest.mark.parametrize("penalties", [False, True])
def test_greedy_output_is_the_constrained_targets(q8_engines, penalties: bool) -> None:
    assert q8_engines["ngram"].info.verify_head == "localspec-q8_0"
    check_greedy(q8_engines, penalties)


def test_greedy_output_with_a_q6_k_head(q6k_head_model: Path) -> None:
    engines = load_pair(q6k_head_model)
    try:
        assert engines["ngram"].info.verify_head == "localspec-q6_k"
        check_greedy(engines, penalties=True)
    finally:
        for engine in engines.values():
            engine.close()


def check_greedy(engines: dict[str, Engine], penalties: bool) -> None:
    params = GenerationParams(temperature=0.0, max_tokens=120, grammar=GBNF)
    if penalties:
        params = replace(params, repeat_penalty=1.3, presence_penalty=0.4)
    plain = engines["none"].generate(PROMPT, params)
    result = engines["ngram"].generate(PROMPT, params, draft_max=8)
    assert result.tokens == plain.tokens
    assert result.stats.candidate_rows >= 4 and result.stats.forced_accepted > 0
    assert plain.stats.candidate_rows == 0


def test_log_probabilities_need_whole_rows(q8_engines) -> None:
    params = GenerationParams(temperature=0.0, max_tokens=60, grammar=GBNF, logprobs=True)
    plain = q8_engines["none"].generate(PROMPT, params)
    result = q8_engines["ngram"].generate(PROMPT, params, draft_max=8)
    assert result.stats.candidate_rows == 0 and result.stats.forced_accepted > 0
    assert result.tokens == plain.tokens
    ours = np.array([t.logprob for t in result.logprobs])
    theirs = np.array([t.logprob for t in plain.logprobs])
    assert np.abs(ours - theirs).max() < 1e-3  # batch shapes change the low bits


def test_sampling_at_candidate_rows_follows_the_constrained_target(q8_engines) -> None:
    """The first token is sampled from row 0, computed at the candidates of the forced text."""
    engine = q8_engines["ngram"]
    outputs = sample_forced_words(engine)
    assert all(o.stats.candidate_rows >= 1 for o in outputs)
    assert_first_tokens_follow_the_constrained_target(engine, outputs)


def test_schema_output_stays_valid(q8_engines) -> None:
    from localspec.text.schema_check import schema_violation

    params = GenerationParams(temperature=0.0, max_tokens=120, grammar=GBNF)
    result = q8_engines["ngram"].generate(PROMPT, params)
    assert schema_violation(result.text, SCHEMA) is None, result.text
