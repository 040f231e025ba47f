"""Recent outputs (SuffixDecoding's idea): with LoadOptions.recent_ngram_tokens the n-gram
drafter also looks up what the engine generated for earlier requests, where it matches longer
than the request's own context; the output stays the target's, and the memory is bounded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.errors import InvalidParameterError
from localspec.runtime.engine import Engine
from localspec.types import GenerationParams

PROMPT = "the quick brown fox jumps over the lazy dog. a tiny model writes"
GREEDY = GenerationParams(temperature=0.0, max_tokens=80, ignore_eos=True, draft_max=8,
                          reuse_cache=False)


@pytest.fixture(scope="module")
def engines(tiny_model_path: Path) -> Iterator[dict[str, Engine]]:
    loaded = {
        "off": Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1),
        "on": Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1,
                          recent_ngram_tokens=4096),
        "small": Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1,
                             recent_ngram_tokens=8),
    }
    yield loaded
    for engine in loaded.values():
        engine.close()


def test_a_repeated_request_drafts_from_the_last_answer(engines: dict[str, Engine]) -> None:
    first_off = engines["off"].generate(PROMPT, GREEDY)
    second_off = engines["off"].generate(PROMPT, GREEDY)
    first_on = engines["on"].generate(PROMPT, GREEDY)
    second_on = engines["on"].generate(PROMPT, GREEDY)
    assert first_on.tokens == second_on.tokens == first_off.tokens == second_off.tokens
    # Without recent outputs the second answer drafts what the first did; with them, most of it
    # comes from the first answer: 8 drafts per pass where the prompt gave a few.
    assert second_off.stats.accepted == first_off.stats.accepted
    assert first_on.stats.accepted == first_off.stats.accepted  # nothing stored yet
    assert second_on.stats.accepted >= first_on.stats.accepted + 20, (
        first_on.stats.accepted, second_on.stats.accepted)
    assert second_on.stats.target_passes < first_on.stats.target_passes


def test_the_memory_is_bounded(engines: dict[str, Engine]) -> None:
    """Eight tokens hold only the end of the last answer: hardly anything to draft from."""
    engines["small"].generate(PROMPT, GREEDY)
    small = engines["small"].generate(PROMPT, GREEDY)
    engines["on"].generate(PROMPT, GREEDY)
    on = engines["on"].generate(PROMPT, GREEDY)
    assert small.tokens == on.tokens
    assert small.stats.accepted + 20 <= on.stats.accepted


def test_the_option_is_checked(tiny_model_path: Path) -> None:
    for bad in (-1, 1 << 21, 1.5, True):
        with pytest.raises(InvalidParameterError, match="recent_ngram_tokens"):
            Engine.load(tiny_model_path, draft="ngram", recent_ngram_tokens=bad)
