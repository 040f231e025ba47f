"""Structured output: a GBNF grammar (or a JSON Schema turned into one) shapes the target's
distribution; speculative output is exactly what the constrained target produces alone."""

from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np
import pytest

from localspec import _core
from localspec.errors import InvalidParameterError
from localspec.runtime.engine import Engine
from localspec.text.grammar import JSON_OBJECT_GBNF, json_schema_to_gbnf
from localspec.types import GenerationParams
from tests.fixtures.stats_helpers import P_VALUE_FLOOR, chi_square_pvalue

WORDS = 'root ::= [a-m] [a-z ]*\n'
FIRST, LATER = re.compile(r"[a-m][a-z ]*"), re.compile(r"[a-z ]*")
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "n": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3},
        "note": {"type": "string", "maxLength": 6},
    },
    "required": ["ok", "color", "n"],
}
GREEDY = GenerationParams(temperature=0.0, max_tokens=60)
PROMPT = "the cat sat on the mat and the cat sat on the"


@pytest.mark.parametrize("drafter", ["ngram", "model", "self"])
def test_greedy_speculative_equals_plain_under_a_grammar(engines, drafter: str) -> None:
    params = GenerationParams(temperature=0.0, max_tokens=40, ignore_eos=True, grammar=WORDS)
    plain = engines["none"].generate(PROMPT, params)
    assert FIRST.fullmatch(plain.text), plain.text
    assert plain.tokens != engines["none"].generate(PROMPT, GREEDY, max_tokens=40).tokens
    result = engines[drafter].generate(PROMPT, params, draft_max=6)
    assert result.stats.drafted > 0
    assert result.tokens == plain.tokens


@pytest.mark.parametrize("drafter", ["none", "model", "self"])
def test_json_schema_output_is_valid_and_lossless(engines, drafter: str) -> None:
    params = GenerationParams(temperature=0.0, max_tokens=120, grammar=json_schema_to_gbnf(SCHEMA))
    plain = engines["none"].generate(PROMPT, params)
    assert plain.finish_reason == "stop", plain.text
    value = json.loads(plain.text)
    assert set(SCHEMA["required"]) <= set(value) <= set(SCHEMA["properties"])
    assert isinstance(value["ok"], bool) and value["color"] in ("red", "green", "blue")
    assert isinstance(value["n"], int)
    assert engines[drafter].generate(PROMPT, params, draft_max=5).tokens == plain.tokens


def test_json_object_mode_gives_an_object(engines) -> None:
    params = GenerationParams(temperature=0.0, max_tokens=200, grammar=JSON_OBJECT_GBNF)
    result = engines["self"].generate("{", params, draft_max=4)
    if result.finish_reason == "stop":
        assert isinstance(json.loads(result.text), dict)
    else:  # a random model may write a long object: what came so far is a JSON prefix
        assert result.text.lstrip().startswith("{")


def test_drafts_the_grammar_forbids_are_not_verified(engines) -> None:
    """The self drafter proposes the unconstrained target's tokens; under a grammar that
    forbids most of them, they are cut before verification, never accepted."""
    params = GenerationParams(temperature=0.0, max_tokens=30, ignore_eos=True, grammar=WORDS)
    free = engines["self"].generate(PROMPT, GREEDY, max_tokens=30, ignore_eos=True, draft_max=4)
    bound = engines["self"].generate(PROMPT, params, draft_max=4)
    assert bound.stats.drafted < free.stats.drafted
    assert bound.stats.rejected <= 1 + bound.stats.target_passes // 4


def test_a_grammar_that_does_not_parse_is_a_clear_error(engines) -> None:
    with pytest.raises(InvalidParameterError, match="grammar is invalid: '\\)' is expected"):
        engines["none"].generate(PROMPT, GREEDY, grammar="root ::= (")


@pytest.mark.parametrize("keyword", ["pattern", "minimum"])
def test_unenforceable_schema_keywords_are_refused(keyword: str) -> None:
    with pytest.raises(InvalidParameterError, match=keyword):
        json_schema_to_gbnf({"type": "object", "properties": {"a": {"type": "string", keyword: 1}}})


def masked(engine: Engine, tokens: list[int], allowed: re.Pattern[str]) -> dict[int, float]:
    """The constrained target distribution computed here: tokens whose text the grammar allows
    at that point keep their logits, the others get -inf (no end of generation in the grammar's
    first position; after it, an end is allowed)."""
    logits = engine.next_token_logits(tokens).astype(np.float64)
    n_vocab = len(logits)
    ok = [bool(allowed.fullmatch(engine.detokenize([t]))) and engine.detokenize([t]) != ""
          for t in range(n_vocab)]
    logits = np.where(ok, logits, -np.inf).astype(np.float32)
    sp = _core.SamplingParams(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0)
    ids, probs = _core.testing.warp(logits, sp)
    return {i: p for i, p in zip(ids, probs, strict=False) if p > 0}


@pytest.mark.parametrize("drafter", ["model", "self"])
def test_sampling_under_a_grammar_follows_the_constrained_target(engines, drafter: str) -> None:
    engine = engines[drafter]
    prompt = engine.tokenize(PROMPT)
    params = GenerationParams(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0, max_tokens=2,
                              ignore_eos=True, grammar=WORDS)
    outputs = [engine.generate(prompt, params, seed=s, draft_max=3) for s in range(2000)]
    # The drafters do not know the grammar: most drafts are cut, some are accepted.
    assert sum(o.stats.accepted for o in outputs) > 10
    first = [o.tokens[0] for o in outputs]
    assert chi_square_pvalue(first, masked(engine, prompt, FIRST)) > P_VALUE_FLOOR
    top = Counter(first).most_common(1)[0][0]
    second = [o.tokens[1] for o in outputs if o.tokens[0] == top]
    right = masked(engine, prompt + [top], LATER)
    assert chi_square_pvalue(second, right) > P_VALUE_FLOOR
    # Power: a grammar state that did not advance past the draft would use the first mask.
    wrong = masked(engine, prompt + [top], FIRST)
    ids = list(wrong)
    weights = np.array([wrong[i] for i in ids]) / sum(wrong.values())
    broken = np.random.default_rng(0).choice(ids, size=len(second), p=weights)
    assert chi_square_pvalue([int(t) for t in broken], right) < 1e-6
