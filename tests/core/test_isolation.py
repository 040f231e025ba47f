"""One generation's failure is its own (csrc/engine/speculative_step.cpp, each_guarded): a
grammar that fails inside a step ends that request with one sentence, and the generations that
share its passes finish exactly as they would alone; a grammar measured costly takes turns
(fair turns) instead of slowing every step."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from localspec import _core
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


def _fourth_beside_three(tiny_model_path: Path, mask_seconds: float) -> tuple[int, int]:
    """Three plain greedy generations and a fourth under a grammar whose check measured
    `mask_seconds` for one mask of the vocabulary, on one core with four slots. Returns the
    tokens the fourth had emitted when the three finished, and its own total."""
    options = _core.EngineOptions()
    options.target_path, options.drafter_kind = str(tiny_model_path), "ngram"
    options.n_ctx, options.n_threads, options.n_seq = 512, 1, 4
    core = _core.Core(options)

    def request(prompt: str, grammar: str = "") -> _core.GenerateRequest:
        r = _core.GenerateRequest()
        r.prompt = core.tokenize(prompt, True, True)
        r.sampling = _core.SamplingParams(temperature=0.0)
        r.max_tokens, r.ignore_eos, r.grammar = 30, True, grammar
        return r

    emitted: Counter[str] = Counter()

    def counting(name: str) -> _core.ChunkCallback:
        def on_chunk(text: str, tokens: list[int], *rest: object) -> bool:
            emitted[name] += len(tokens)
            return True
        return on_chunk

    try:
        core.generate(request(HEALTHY[0]))  # the time of a step is known before the four start
        plain = {core.start(request(p), counting("plain")) for p in HEALTHY}
        costly = request("the quick brown", grammar="root ::= [a-z ]*")
        costly.grammar_mask_seconds = mask_seconds
        fourth = core.start(costly, counting("fourth"))
        finished: set[int] = set()
        when_the_three_ended = -1
        while fourth not in finished or not plain <= finished:
            finished.update(core.step().finished)
            if when_the_three_ended < 0 and plain <= finished:
                when_the_three_ended = emitted["fourth"]
        assert emitted["plain"] == 3 * 30
        return when_the_three_ended, emitted["fourth"]
    finally:
        core.close()


def test_a_grammar_that_measured_costly_waits_its_turns(tiny_model_path: Path) -> None:
    """Fair turns (SpecEngine::take_turns): a grammar whose check measured a whole-vocabulary
    mask far dearer than a step sits out the steps of the generations beside it from its first
    step on, and still finishes once they are done; a cheap one advances with them."""
    waited, total = _fourth_beside_three(tiny_model_path, mask_seconds=100.0)
    assert waited == 0 and total == 30
    together, total = _fourth_beside_three(tiny_model_path, mask_seconds=0.0)
    assert together > 10 and total == 30
