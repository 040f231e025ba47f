"""The real instruct pair (issue 51): Qwen2.5-Coder 1.5B Instruct drafted by 0.5B Instruct,
assembled from the coder extra's packages (tests/conftest.py, real_pair). Greedy speculative
output is the target's plain output with each drafter a user can pick for it, on chat prompts
through the model's own template: identical, or parted at a numerical near-tie that replaying
the same passes reproduces (default mode: a pass of more rows may sum in another order,
docs/exact.md); `localspec check` measures the pair."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from localspec.bench.lossless import compare_greedy
from localspec.drafter_spec import DrafterSpec
from localspec.runtime.engine import Engine
from localspec.text.chat_template import chat_format, chat_tokens
from localspec.types import GenerationParams, GenerationResult
from tests.fixtures.helpers import run_localspec

QUESTIONS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences what a hash map is.",
    "Rename the variable x to count in: x = 0\nfor item in items:\n    x += item\nprint(x)",
)
GREEDY = GenerationParams(max_tokens=40, temperature=0.0, ignore_eos=True, reuse_cache=False,
                          seed=0)


@pytest.fixture(scope="module")
def engine(real_pair: Any) -> Iterator[Engine]:
    with Engine.load(real_pair.target, real_pair.drafter, n_ctx=1024) as loaded:
        yield loaded


def assert_lossless(engine: Engine, prompt: list[int], plain: list[int],
                    result: GenerationResult, what: str) -> None:
    divergence = compare_greedy(engine, prompt, plain, result, params=GREEDY)
    assert divergence is None or divergence.verdict == "tie", (what, divergence)


def chat(engine: Engine, question: str) -> list[int]:
    form = chat_format(engine.info.chat_template)
    return chat_tokens(form.template, [{"role": "user", "content": question}], engine.info,
                       engine.tokenize)


@pytest.fixture(scope="module")
def plain(engine: Engine) -> list[list[int]]:
    return [list(engine.generate(chat(engine, q), replace(GREEDY, speculative=False)).tokens)
            for q in QUESTIONS]


def test_the_pair_is_the_1_5b_drafted_by_n_gram_lookup_then_the_0_5b(real_pair: Any) -> None:
    assert real_pair.drafter.kind == "hybrid"
    assert real_pair.target.name == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    assert real_pair.drafter.path.endswith("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")


@pytest.mark.parametrize("draft_max", [3, "auto"])
def test_hybrid_output_is_the_plain_output(engine: Engine, plain: list[list[int]],
                                           draft_max: int | str) -> None:
    drafted = 0
    for question, expected in zip(QUESTIONS, plain, strict=True):
        prompt = chat(engine, question)
        result = engine.generate(prompt, replace(GREEDY, draft_max=draft_max))
        assert_lossless(engine, prompt, expected, result, question)
        drafted += result.stats.drafted
    assert drafted > 0 or draft_max == "auto"  # auto may rightly draft nothing in 40 tokens


def test_the_draft_model_alone_and_auto_give_the_plain_output(real_pair: Any,
                                                             plain: list[list[int]]) -> None:
    """The 0.5B alone at a fixed length (every step drafts with it) and `auto` (n-gram here)."""
    for spec in (DrafterSpec("model", real_pair.drafter.path), DrafterSpec("auto")):
        with Engine.load(real_pair.target, spec, n_ctx=1024) as engine:
            for question, expected in zip(QUESTIONS, plain, strict=True):
                prompt = chat(engine, question)
                result = engine.generate(prompt, replace(GREEDY, draft_max=2))
                assert_lossless(engine, prompt, expected, result, f"{spec}: {question}")
                if spec.kind == "model":
                    assert result.stats.drafted_by_kind.get("model", 0) > 0


def test_check_measures_the_pair(real_pair: Any) -> None:
    """`localspec check` on the pair: the vocabularies match, outputs are the plain ones, and
    the draft model's cost per token is measured against a target pass (its probe)."""
    proc = run_localspec("check", "--pair", "qwen2.5-coder-1.5b", "--categories", "code",
                         "--max-tokens", "24", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["vocabulary"]["compatible"] is True
    m = out["measurement"]
    assert m["identical"] in ("yes", "tie") and m["n_prompts"] == 1
    assert m["draft_token_seconds"] > 0 and m["target_pass_seconds"] > 0


def test_exact_mode_gives_the_plain_output_bit_for_bit(real_pair: Any) -> None:
    """Exact mode on the pair (localspec's batch-invariant kernels for every quantized matrix):
    the hybrid drafter at a fixed length, whose passes verify 1-4 rows, gives exactly the
    tokens of exact mode's plain decoding, with no near-tie allowed."""
    with Engine.load(real_pair.target, real_pair.drafter, n_ctx=1024, exact=True) as engine:
        assert engine.info.exact
        question = QUESTIONS[0]
        prompt = chat(engine, question)
        plain = engine.generate(prompt, replace(GREEDY, speculative=False))
        result = engine.generate(prompt, replace(GREEDY, draft_max=3, exact=True))
        assert result.stats.drafted > 0
        assert list(result.tokens) == list(plain.tokens)
