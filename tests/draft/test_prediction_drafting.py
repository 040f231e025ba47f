"""Predicted Outputs: the request's prediction of its output is drafted from, verified like any
draft (the output is the target's whatever the prediction says), and an edit (a deleted,
inserted or changed span) does not end the drafting for the rest of the output."""

from __future__ import annotations

import numpy as np
import pytest

from localspec import _core
from localspec.errors import InvalidParameterError
from localspec.runtime.engine import Engine
from localspec.types import GenerationParams, GenerationResult
from tests.fixtures.stats_helpers import P_VALUE_FLOOR, chi_square_pvalue

PROMPT = "the quick brown fox jumps over the lazy dog. a tiny model writes"
N = 100
# A fixed draft length: which tokens are drafted then depends on the alignment alone, not on
# the controller's timings.
GREEDY = GenerationParams(temperature=0.0, max_tokens=N, ignore_eos=True, draft_max=8)


@pytest.fixture(scope="module")
def plain(engines) -> GenerationResult:
    return engines["none"].generate(PROMPT, GREEDY)


def predicted(engine: Engine, prediction: list[int] | str, **overrides: object) -> GenerationResult:
    if isinstance(prediction, list):
        return engine.generate(PROMPT, GREEDY, prediction=tuple(prediction), **overrides)
    return engine.generate(PROMPT, GREEDY, prediction=prediction, **overrides)


def test_the_exact_prediction_is_drafted_and_accepted(engines, plain) -> None:
    result = predicted(engines["ngram"], plain.tokens)
    assert result.tokens == plain.tokens
    stats = result.stats
    assert stats.rejected_prediction_tokens == 0
    # 8 drafts and a bonus token per pass (the last pass may have fewer drafts left to make).
    assert stats.target_passes <= -(-N // 9) + 1
    assert stats.accepted_prediction_tokens == N - stats.target_passes
    assert stats.drafted_by_kind["prediction"] == stats.accepted_prediction_tokens


@pytest.mark.parametrize("edit", ["delete", "insert", "change"])
def test_drafting_goes_on_after_an_edit(engines, plain, edit: str) -> None:
    """The output is the plain one; the prediction is it with a span edited at token 40. After
    the edit the output rejoins the prediction and the rest is drafted from it."""
    out = plain.tokens
    junk = [t for t in range(50, 400) if t not in out][:10]
    prediction = {
        "delete": out[:40] + out[50:],
        "insert": out[:40] + junk + out[40:],
        "change": out[:40] + junk[:3] + out[43:],
    }[edit]
    result = predicted(engines["ngram"], prediction)
    assert result.tokens == plain.tokens
    stats = result.stats
    # 8 of every 9 tokens in the 90 outside the edit, but for a few tokens to rejoin.
    assert stats.accepted_prediction_tokens >= 8 * 90 // 9 - 12, stats.accepted_by_kind
    assert stats.rejected_prediction_tokens <= 16


def test_a_wrong_prediction_changes_nothing_but_speed(engines, plain) -> None:
    rng = np.random.default_rng(0)
    n_vocab = engines["ngram"].info.n_vocab
    junk = [int(t) for t in rng.integers(0, n_vocab, size=N)]
    for drafter in ("ngram", "hybrid"):
        result = predicted(engines[drafter], junk)
        assert result.tokens == plain.tokens
        assert result.stats.accepted_prediction_tokens <= 10


def test_a_text_prediction_and_the_controller(engines, plain) -> None:
    """Text is tokenized as output would be. (The tiny model's output is not valid UTF-8, so
    its text does not give its tokens back: drafts are tried and mostly rejected.)"""
    text = engines["none"].detokenize(plain.tokens)
    assert engines["ngram"].prediction_tokens(text) == engines["ngram"].tokenize(
        text, add_special=False, parse_special=False)
    auto = predicted(engines["ngram"], text, draft_max="auto")
    assert auto.tokens == plain.tokens
    fixed = predicted(engines["hybrid"], text)
    assert fixed.tokens == plain.tokens
    assert fixed.stats.drafted_by_kind["prediction"] > 0


def test_without_drafting_a_prediction_is_ignored(engines, plain) -> None:
    for result in (predicted(engines["none"], plain.tokens),
                   predicted(engines["ngram"], plain.tokens, speculative=False)):
        assert result.tokens == plain.tokens
        assert result.stats.drafted == 0
        assert result.stats.accepted_prediction_tokens == 0


def test_a_bad_prediction_is_refused_naming_it(engines) -> None:
    engine = engines["ngram"]
    n_vocab = engine.info.n_vocab
    with pytest.raises(InvalidParameterError, match="prediction") as error:
        engine.generate(PROMPT, GREEDY, prediction=(1, n_vocab))
    assert error.value.param == "prediction"
    with pytest.raises(InvalidParameterError, match="prediction has .* tokens but the context"):
        engine.generate(PROMPT, GREEDY, prediction=" fox" * 2000)
    with pytest.raises(InvalidParameterError, match="prediction="):
        engine.generate(PROMPT, GREEDY, prediction=[1, 2])  # a list: not text nor a tuple
    # The core checks what reaches it too.
    request = _core.GenerateRequest()
    request.prompt = engine.tokenize(PROMPT)
    request.prediction = [n_vocab + 5]
    with pytest.raises(InvalidParameterError, match="prediction token id"):
        engine._core.start(request, lambda chunk: True)  # type: ignore[attr-defined]


def target_first(engine: Engine, prompt: list[int], sampling: GenerationParams) -> dict[int, float]:
    logits = engine.next_token_logits(prompt).astype(np.float32)
    sp = _core.SamplingParams(temperature=sampling.temperature, top_k=sampling.top_k,
                              top_p=sampling.top_p, min_p=sampling.min_p)
    ids, probs = _core.testing.warp(logits, sp)
    return {i: p for i, p in zip(ids, probs, strict=False) if p > 0}


def test_sampling_with_a_prediction_follows_the_target(engines) -> None:
    """At temperature 1 a predicted token is kept with the target's probability of it: the first
    tokens of 1000 samples, each predicted to be the target's likeliest, follow the target's
    distribution (chi-square), which they would not if predictions were taken as certain."""
    engine = engines["ngram"]
    sampling = GenerationParams(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0, max_tokens=2,
                                ignore_eos=True, draft_max=1)
    prompt = engine.tokenize(PROMPT)
    right = target_first(engine, prompt, sampling)
    likeliest = max(right, key=lambda t: right[t])
    assert 0.05 < right[likeliest] < 0.95  # a real choice
    outputs = [engine.generate(prompt, sampling, seed=s, prediction=(likeliest,))
               for s in range(1000)]
    drafted = sum(o.stats.drafted_by_kind["prediction"] for o in outputs)
    accepted = sum(o.stats.accepted_prediction_tokens for o in outputs)
    assert drafted == 1000 and 0 < accepted < drafted
    first = [o.tokens[0] for o in outputs]
    assert chi_square_pvalue(first, right) > P_VALUE_FLOOR
    broken = [likeliest] * len(first)  # power: predictions taken as certain
    assert chi_square_pvalue(broken, right) < 1e-6
