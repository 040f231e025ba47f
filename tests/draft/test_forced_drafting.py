"""Grammar-forced drafting: where the request's grammar admits one continuation, its tokens are
drafted for free, verified like any draft, and reported as their own kind."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from localspec import _core
from localspec.runtime.engine import Engine
from localspec.text.grammar import json_schema_to_gbnf
from localspec.text.schema_check import schema_violation
from localspec.types import GenerationParams, GenerationResult
from tests.fixtures.helpers import run_bench
from tests.fixtures.stats_helpers import P_VALUE_FLOOR, chi_square_pvalue
from tests.text.test_structured import PROMPT, SCHEMA

GBNF = json_schema_to_gbnf(SCHEMA)
# Sampling test: " dog" is forced (the tiny target writes it as " dog" ~70% of the time, else
# " d" or " " first), then a word goes on.
FORCED = " dog"
FORCED_WORDS = f'root ::= "{FORCED}" [a-m] [a-z ]*\n'


def tokens_of(engine: Engine, text: str) -> list[int]:
    return [t for t in engine.tokenize(text) if engine.detokenize([t])]


def test_forced_text_is_the_grammars_one_continuation(engines, tiny_model_path: Path) -> None:
    path = str(tiny_model_path)
    assert _core.testing.forced_text(path, GBNF, [], 64) == b'{"ok": '
    after_ok = tokens_of(engines["none"], '{"ok": true')
    # Every color starts with a quote: it is forced too; the color itself is a choice.
    assert _core.testing.forced_text(path, GBNF, after_ok, 64) == b', "color": "'
    assert _core.testing.forced_text(path, GBNF, after_ok, 5) == b', "co'
    # Where the grammar may end, nothing is forced.
    done = tokens_of(engines["none"], '{"ok": true, "color": "red", "n": 7}')
    assert _core.testing.forced_text(path, GBNF, done, 64) == b""


@pytest.mark.parametrize("drafter", ["ngram", "hybrid"])
def test_forced_drafting_is_lossless_greedy(engines, drafter: str) -> None:
    params = GenerationParams(temperature=0.0, max_tokens=120, grammar=GBNF)
    plain = engines["none"].generate(PROMPT, params)
    result = engines[drafter].generate(PROMPT, params, draft_max=8)
    assert result.tokens == plain.tokens
    assert schema_violation(result.text, SCHEMA) is None, result.text
    stats = result.stats
    assert stats.forced_drafted > 0 and 0 < stats.forced_accepted <= stats.forced_drafted
    assert stats.forced_accepted <= stats.accepted and stats.forced_drafted <= stats.drafted
    assert result.to_dict()["stats"]["drafted_by_kind"]["forced"] == stats.forced_drafted
    # Forced text is drafted with the controller choosing ("auto") as well.
    auto = engines[drafter].generate(PROMPT, params)
    assert auto.tokens == plain.tokens


def test_without_a_grammar_nothing_is_forced(engines) -> None:
    result = engines["ngram"].generate(PROMPT, GenerationParams(temperature=0.0, max_tokens=40),
                                       draft_max=6)
    assert result.stats.forced_drafted == 0


def test_forced_tokens_save_target_passes(engines) -> None:
    """Keys and punctuation come from the grammar, so a JSON answer needs fewer passes than
    tokens, even from a drafter with nothing to copy (n-gram lookup at its first tokens)."""
    params = GenerationParams(temperature=0.0, max_tokens=120, grammar=GBNF)
    result = engines["ngram"].generate(PROMPT, params, draft_max=8)
    stats = result.stats
    assert stats.target_passes <= stats.n_tokens - stats.forced_accepted + 1
    assert stats.forced_accepted >= 4  # '{"ok": ', ', "color": "', ', "n": ' hold more


def allowed_first(text: str) -> bool:
    """Tokens FORCED_WORDS allows first: a prefix of the forced text, or it and a word."""
    word = re.fullmatch(f"{FORCED}[a-m][a-z ]*", text)
    return bool(text) and (FORCED.startswith(text) or word is not None)


def constrained_first(engine: Engine, prompt: list[int]) -> dict[int, float]:
    logits = engine.next_token_logits(prompt).astype(np.float64)
    ok = [allowed_first(engine.detokenize([t])) for t in range(len(logits))]
    masked = np.where(ok, logits, -np.inf).astype(np.float32)
    sp = _core.SamplingParams(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0)
    ids, probs = _core.testing.warp(masked, sp)
    return {i: p for i, p in zip(ids, probs, strict=False) if p > 0}


def sample_forced_words(engine: Engine) -> list[GenerationResult]:
    """2000 two-token samples under FORCED_WORDS, the forced text drafted at every first step."""
    params = GenerationParams(temperature=1.0, top_k=10, top_p=1.0, min_p=0.0, max_tokens=2,
                              ignore_eos=True, grammar=FORCED_WORDS)
    prompt = engine.tokenize(PROMPT)
    return [engine.generate(prompt, params, seed=s, draft_max=3) for s in range(2000)]


def assert_first_tokens_follow_the_constrained_target(engine: Engine,
                                                      outputs: list[GenerationResult]) -> None:
    first = [o.tokens[0] for o in outputs]
    right = constrained_first(engine, engine.tokenize(PROMPT))
    assert len(right) > 1
    assert chi_square_pvalue(first, right) > P_VALUE_FLOOR
    # Power: a rule that took forced drafts as certain (no verification) would always emit the
    # forced text's first token.
    broken = [tokens_of(engine, FORCED)[0]] * len(first)
    assert chi_square_pvalue(broken, right) < 1e-6


def test_sampling_with_forced_drafts_follows_the_constrained_target(engines) -> None:
    engine = engines["ngram"]
    outputs = sample_forced_words(engine)
    drafted = sum(o.stats.forced_drafted for o in outputs)
    accepted = sum(o.stats.forced_accepted for o in outputs)
    assert drafted == 2000 and 0 < accepted < drafted  # max_tokens 2: one draft per step
    assert_first_tokens_follow_the_constrained_target(engine, outputs)


def test_bench_structured_prompts_are_constrained_valid_and_report_forced_drafts(
        tiny_model_path: Path, tmp_path: Path) -> None:
    line = {"id": "fields", "category": "structured", "prompt": PROMPT, "json_schema": SCHEMA}
    prompts = tmp_path / "structured.jsonl"
    prompts.write_text(json.dumps(line) + "\n")
    proc = run_bench("--target", str(tiny_model_path), "--draft", "ngram", "--prompts",
                     str(prompts), "--repeat", "1", "--max-tokens", "120", "--draft-max", "8",
                     "--json")
    assert proc.returncode == 0, proc.stderr
    overall = json.loads(proc.stdout)["overall"]
    assert overall["valid"] == "yes" and overall["identical"] in ("yes", "tie")
    assert overall["forced_drafted"] > 0 and overall["forced_accepted"] > 0


def test_bench_built_in_structured_set_loads() -> None:
    from localspec.bench.prompts import load_prompts

    prompts = load_prompts("structured")
    assert len(prompts) >= 10
    for prompt in prompts:
        assert prompt.json_schema is not None and json.dumps(prompt.json_schema) in prompt.text
