"""The n-gram ceiling of `localspec bench`: timed passes, the oracle's dynamic programme, and the
property that makes it a ceiling (no real run of the engine costs less under the same costs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localspec import _core
from localspec.bench.ceiling import engine_lookup, oracle_cost
from tests.bench.test_bench import bench


def test_pass_seconds_times_every_row_count(engines: dict[str, object]) -> None:
    from localspec.errors import LocalspecError
    from localspec.runtime.engine import Engine

    engine = engines["ngram"]
    assert isinstance(engine, Engine)
    context = engine.tokenize("the quick brown fox jumps over the lazy dog")
    seconds = engine.pass_seconds(context, max_rows=4, repeats=3)
    assert len(seconds) == 5 and seconds[0] == 0.0
    assert all(s > 0 for s in seconds[1:])
    for bad in (0, len(context)):  # rows must leave at least one token of context
        with pytest.raises((ValueError, LocalspecError)):
            engine.pass_seconds(context, max_rows=bad, repeats=1)


def perfect_lookup(prompt: list[int], output: list[int], seen: list[list[int]]):  # type: ignore[no-untyped-def]
    """Proposes exactly what the target will emit; records the histories it is asked about."""

    def lookup(history: list[int], k: int) -> list[int]:
        seen.append(list(history))
        i = len(history) - len(prompt)
        return output[i:i + k]

    return lookup


def test_oracle_with_perfect_drafts_takes_the_longest_cheap_passes() -> None:
    prompt, output = [7, 8], list(range(10, 18))  # 8 tokens
    costs = [0.0, 1.0, 1.1, 1.2, 1.3]  # up to 4 rows: 4 tokens for 1.3
    seen: list[list[int]] = []
    cost = oracle_cost(prompt, output, perfect_lookup(prompt, output, seen), costs, k_max=3)
    assert cost == pytest.approx(2 * 1.3)
    # The lookup saw the prompt plus exactly the tokens before each position.
    assert seen == [prompt + output[:i] for i in range(len(output) - 1)]


def test_oracle_skips_drafts_that_do_not_pay() -> None:
    prompt, output = [1], [5, 6, 7, 8, 9, 10]
    costs = [0.0, 1.0, 1.1, 5.0, 9.0]  # 2 rows pay, 3 and 4 do not
    cost = oracle_cost(prompt, output, perfect_lookup(prompt, output, []), costs, k_max=3)
    assert cost == pytest.approx(3 * 1.1)  # three 2-row passes, not the longest drafts


def test_oracle_without_matches_costs_plain_decoding() -> None:
    costs = [0.0, 1.0, 1.1, 1.2]
    assert oracle_cost([1, 2], [3, 4, 5, 6], lambda history, k: [], costs, k_max=2) == 4.0
    wrong = oracle_cost([1, 2], [3, 4, 5, 6], lambda history, k: [0] * k, costs, k_max=2)
    assert wrong == 4.0  # a draft that is never accepted gains nothing


def test_oracle_stops_drafting_at_the_last_token() -> None:
    asked: list[int] = []

    def lookup(history: list[int], k: int) -> list[int]:
        asked.append(k)
        return [0] * k

    oracle_cost([1], [2, 3, 4], lookup, [0.0, 1.0, 1.0, 1.0, 1.0], k_max=3)
    assert asked == [2, 1]  # no draft past the tokens still wanted, none at the last one


def test_engine_lookup_is_the_drafters() -> None:
    lookup = engine_lookup()
    history = [1, 2, 3, 4, 1, 2]
    options = _core.EngineOptions()
    n_min, n_max = options.ngram_min, options.ngram_max
    assert lookup(history, 2) == _core.ngram_lookup(history, n_min, n_max, 2)
    assert lookup(history, 2) == [3, 4]  # what followed the earlier "1 2"


@pytest.mark.parametrize("draft_max", [3, "auto"])
def test_no_real_run_beats_the_oracle(engines: dict[str, object], draft_max: int | str) -> None:
    """The engine's own passes, priced with the same costs, never cost less than the oracle:
    it drafts from the same lookup on the same histories, so its choices are the oracle's too."""
    from localspec.runtime.engine import Engine

    engine = engines["ngram"]
    assert isinstance(engine, Engine)
    prompt = "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over"
    prompt_tokens = engine.tokenize(prompt)
    for _ in range(3):  # the controller drafts on evidence: let it learn this text first
        engine.generate(prompt, max_tokens=40, temperature=0, ignore_eos=True,
                        draft_max=draft_max, reuse_cache=False)
    spec = engine.generate(prompt, max_tokens=40, temperature=0, ignore_eos=True,
                           draft_max=draft_max, reuse_cache=False)
    plain = engine.generate(prompt, max_tokens=40, temperature=0, ignore_eos=True,
                            speculative=False, reuse_cache=False)
    assert max(spec.pass_rows) > 1  # it did draft, or the test proves nothing
    k_max = 15 if draft_max == "auto" else int(draft_max)
    seconds = engine.pass_seconds(prompt_tokens + plain.tokens, k_max + 1, repeats=3)
    costs = [s / seconds[1] for s in seconds]
    real = sum(costs[rows] for rows in spec.pass_rows)
    best = oracle_cost(prompt_tokens, spec.tokens, engine_lookup(), costs, k_max)
    assert best <= real + 1e-9
    assert best <= len(spec.tokens)  # never worse than plain decoding


def test_bench_prints_the_ceiling_for_ngram_drafts(tiny_model_path: Path,
                                                   prompt_file: Path) -> None:
    proc = bench("--target", str(tiny_model_path), "--draft", "ngram", "--prompts",
                 str(prompt_file), "--max-tokens", "16", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    ceiling = out["ngram_ceiling"]
    assert [r["label"] for r in ceiling["rows"]] == ["summarization", "conversation", "all"]
    assert ceiling["max_rows"] == 16 and ceiling["pass_costs"][1] == 1.0
    for row, category in zip(ceiling["rows"], out["categories"] + [out["overall"]], strict=True):
        assert row["speedup"] == category["speedup"]
        assert row["ceiling"] >= 1.0
        assert row["of_ceiling"] == pytest.approx(row["speedup"] / row["ceiling"])
    table = bench("--target", str(tiny_model_path), "--draft", "ngram", "--prompts",
                  str(prompt_file), "--max-tokens", "8")
    assert "n-gram ceiling" in table.stdout and "of ceiling" in table.stdout


def test_bench_has_no_ceiling_for_model_drafts(tiny_model_path: Path, tiny_draft_path: Path,
                                               prompt_file: Path) -> None:
    proc = bench("--target", str(tiny_model_path), "--draft", str(tiny_draft_path), "--prompts",
                 str(prompt_file), "--max-tokens", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "ngram_ceiling" not in json.loads(proc.stdout)
