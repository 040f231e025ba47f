"""One generation's failure is its own (csrc/engine/speculative_step.cpp, each_guarded): a
grammar that fails inside a step ends that request with one sentence, and the generations that
share its passes finish exactly as they would alone."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from localspec.runtime.engine import Engine
from localspec.text.grammar_check import GrammarError
from localspec.types import GenerationParams

GREEDY = GenerationParams(temperature=0.0, max_tokens=30, ignore_eos=True)
HEALTHY = ["the quick brown fox", "hello world, this is", "one two three four one two three"]
# Passes localspec's check (the syntax is fine, the id is in the vocabulary, the first state
# allows tokens) and llama.cpp's parser, then fails in a step: after "a", no token of the tiny
# model can be token 0's text.
POISON = 'root ::= "a" <[0]>'


@pytest.fixture(scope="module", params=["ngram", "model"])
def engines(request: pytest.FixtureRequest, tiny_model_path: Path,
            tiny_draft_path: Path) -> Iterator[tuple[Engine, Engine]]:
    draft = "ngram" if request.param == "ngram" else str(tiny_draft_path)
    solo = Engine.load(tiny_model_path, draft=draft, n_threads=1, n_ctx=512)
    batched = Engine.load(tiny_model_path, draft=draft, n_threads=1, n_ctx=512, parallel=4)
    yield solo, batched
    solo.close()
    batched.close()


def test_a_poisoned_grammar_ends_its_request_alone(engines: tuple[Engine, Engine]) -> None:
    solo, batched = engines
    expected = [solo.generate(p, GREEDY).tokens for p in HEALTHY]
    healthy = [batched.submit(p, GREEDY) for p in HEALTHY]
    next(iter(healthy[0]))  # they are running when the poisoned one joins
    poisoned = batched.submit("the cat", replace(GREEDY, grammar=POISON))
    with pytest.raises(GrammarError, match="The generation stopped: the grammar allows no token"):
        poisoned.result(timeout=120)
    assert [h.result(timeout=120).tokens for h in healthy] == expected
    # ... and the engine serves the next request as before.
    assert batched.generate(HEALTHY[0], GREEDY).tokens == expected[0]


def test_a_grammar_that_matches_nothing_from_the_start_is_refused_when_checked(
        engines: tuple[Engine, Engine]) -> None:
    solo, _ = engines
    with pytest.raises(GrammarError, match="allows no token"):
        solo.check_grammar("root ::= <[0]>")


def test_a_grammar_that_matches_nothing_is_an_error_not_noise(
        engines: tuple[Engine, Engine]) -> None:
    solo, _ = engines
    with pytest.raises(GrammarError) as raised:
        solo.generate("hello", replace(GREEDY, grammar=POISON))
    assert raised.value.param == "grammar"
    assert "\ufffd" not in str(raised.value)
