"""Speculative generation on real (tiny, generated) GGUF models through real llama.cpp."""

from __future__ import annotations

import pytest

from localspec.bench.lossless import compare_greedy
from localspec.runtime.engine import Engine
from localspec.types import GenerationParams, GenerationResult

PROMPTS = [
    "the quick brown fox",
    "hello world, this is",
    "the cat sat on the mat and the dog sat on the log. the cat sat",
    "def main(): return",
]
GREEDY = GenerationParams(temperature=0.0, max_tokens=48)


def assert_same_or_tie(reference: Engine, prompt: str, expected: list[int], result) -> None:
    """Greedy outputs must be identical; a divergence is allowed only as a numerical tie
    (localspec.bench.lossless: near-equal logits, or a same-shape replay by the target confirms
    every emitted token)."""
    divergence = compare_greedy(reference, reference.tokenize(prompt), expected, result)
    assert divergence is None or divergence.verdict == "tie", divergence


@pytest.mark.parametrize("drafter", ["ngram", "model", "self", "hybrid"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_output_equals_target_only(engines, drafter: str, k: int) -> None:
    plain = engines["none"]
    for prompt in PROMPTS:
        expected = plain.generate(prompt, GREEDY).tokens
        result = engines[drafter].generate(prompt, GREEDY, draft_max=k)
        assert result.stats.n_tokens == len(result.tokens) == len(result.provenance)
        assert_same_or_tie(plain, prompt, expected, result)


def test_plain_decoding_has_mean_accepted_length_one(engines) -> None:
    stats = engines["none"].generate(PROMPTS[0], GREEDY).stats
    assert stats.drafted == 0 and stats.mean_accepted_length == 1.0
    assert stats.target_passes == stats.n_tokens


def test_plain_answer_that_ends_itself_has_mean_accepted_length_one(engines) -> None:
    """The pass that yields the end-of-generation token counts (it ran) and its token is not
    emitted: tau is still 1.0 for plain decoding (not n_tokens / passes, which is below it)."""
    params = GenerationParams(temperature=0.0, max_tokens=20, grammar='root ::= "the cat"')
    result = engines["none"].generate(PROMPTS[0], params)
    stats = result.stats
    assert result.finish_reason == "stop" and stats.drafted == 0
    assert stats.target_passes == stats.n_tokens + 1
    assert stats.mean_accepted_length == 1.0


def test_identical_draft_accepts_almost_everything(engines) -> None:
    for prompt in PROMPTS:
        stats = engines["self"].generate(prompt, GREEDY, draft_max=4).stats
        assert stats.drafted > 0
        assert stats.acceptance_rate >= 0.98
        assert stats.mean_accepted_length > 3.0


def test_different_draft_is_sometimes_rejected(engines) -> None:
    """The test pair agrees often but not always, so rollback paths are exercised."""
    total = [engines["model"].generate(p, GREEDY, draft_max=4).stats for p in PROMPTS]
    drafted = sum(s.drafted for s in total)
    accepted = sum(s.accepted for s in total)
    assert 0 < accepted < drafted


def test_statistics_are_consistent(engines) -> None:
    result = engines["model"].generate(PROMPTS[1], GREEDY, draft_max=4)
    s = result.stats
    assert s.accepted + s.rejected == s.drafted
    assert sum(s.accepted_length_histogram) == s.target_passes
    assert sum(n * c for n, c in enumerate(s.accepted_length_histogram)) == s.accepted
    assert result.provenance.count("draft") == s.accepted - (
        s.accepted + s.target_passes - s.n_tokens
    )
    assert s.mean_accepted_length == pytest.approx((s.accepted + s.target_passes) / s.target_passes)
    assert s.acceptance_by_position[0] >= 0.0 and len(s.drafted_by_position) <= 4
    assert s.tokens_per_second > 0 and s.generation_seconds > 0


def test_rollback_is_clean(engines) -> None:
    """After a generation with rejections, continuing from a prefix of its output must give the
    same tokens as a fresh engine that never saw the rejected drafts."""
    spec = engines["model"]
    first = spec.generate(PROMPTS[2], GREEDY, draft_max=6)
    assert first.stats.rejected > 0
    prefix = spec.tokenize(PROMPTS[2]) + first.tokens[:20]
    continued = spec.generate(prefix, GREEDY, draft_max=6).tokens
    fresh = engines["none"].generate(prefix, GREEDY).tokens
    assert continued[:28] == first.tokens[20:48]
    assert continued == fresh


def test_stream_chunks_add_up_to_the_result(engines) -> None:
    engine = engines["model"]
    chunks = list(engine.stream(PROMPTS[0], GREEDY, draft_max=4))
    result = engine.generate(PROMPTS[0], GREEDY, draft_max=4)
    assert [t for c in chunks for t in c.tokens] == result.tokens
    assert "".join(c.text for c in chunks) == result.text
    assert all(len(c.tokens) >= 1 for c in chunks)
    assert chunks[-1].stats.n_tokens == result.stats.n_tokens


def test_seeded_sampling_is_reproducible(engines) -> None:
    """Same seed, same output for a fixed draft length. (With draft_max="auto" the draft
    lengths follow measured timings, so a seed fixes the distribution, not the sample.)"""
    params = GenerationParams(
        temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, max_tokens=32, seed=7, draft_max=4
    )
    for name in ("none", "ngram", "model", "hybrid"):
        a = engines[name].generate(PROMPTS[0], params)
        b = engines[name].generate(PROMPTS[0], params)
        assert a.tokens == b.tokens
    other = engines["model"].generate(PROMPTS[0], params, seed=8)
    assert other.tokens != engines["model"].generate(PROMPTS[0], params).tokens


def test_stop_strings_and_max_tokens(engines) -> None:
    engine = engines["none"]
    full = engine.generate(PROMPTS[3], GREEDY)
    assert full.finish_reason == "length" and len(full.tokens) == GREEDY.max_tokens
    # Pick a stop string from the middle of the greedy text; the output must end right before it.
    text = full.text
    stop = next(
        text[i : i + 3]
        for i in range(5, len(text) - 3)
        if text[i : i + 3].isascii() and text[i : i + 3].strip()
    )
    cut = engines["model"].generate(PROMPTS[3], GREEDY, stop=(stop,))
    assert cut.finish_reason == "stop"
    assert cut.text == text[: text.index(stop)]


def test_cancel_stops_within_one_step(engines) -> None:
    engine = engines["ngram"]
    handle = engine.submit(
        PROMPTS[0], GenerationParams(temperature=0.0, max_tokens=500, ignore_eos=True)
    )
    queued = 0
    for seen, _chunk in enumerate(handle, start=1):
        if seen == 1:
            handle.cancel()
            queued = handle._chunks.qsize()  # steps that ran before the cancel arrived
    result = handle.result()
    assert result.finish_reason == "cancelled"
    # The chunk seen, those already queued, and at most the one step then in flight.
    assert result.stats.target_passes <= 1 + queued + 1 < 500


def test_tie_check_rejects_a_wrong_token(engines) -> None:
    """The tie rule must be able to fail: a fabricated divergence is not confirmed by the
    target's replay, and a fabricated wrong token in plain output is caught too."""
    plain = engines["none"]
    reference = plain.generate(PROMPTS[0], GREEDY)
    spec = engines["model"].generate(PROMPTS[0], GREEDY, draft_max=4)
    wrong = list(spec.tokens)
    wrong[3] = (wrong[3] + 1) % 300
    forged = GenerationResult("", wrong, spec.provenance, "length", spec.stats,
                              spec.pass_rows, spec.pass_emitted)
    with pytest.raises(AssertionError):
        assert_same_or_tie(plain, PROMPTS[0], reference.tokens, forged)
    honest = plain.replay_greedy(plain.tokenize(PROMPTS[0]), spec)
    assert (honest.first_mismatch, honest.passes) == (-1, len(spec.pass_rows))
    # The replay reports the first mismatch and still runs every pass after it (bench --modes
    # times the same passes in both modes from it).
    caught = plain.replay_greedy(plain.tokenize(PROMPTS[0]), forged)
    assert (caught.first_mismatch, caught.passes) == (3, len(spec.pass_rows))


def test_seeded_sampling_with_deterministic_drafts_is_plain_sampling(engines) -> None:
    """With n-gram (deterministic) drafts, a seed gives the same tokens as plain sampling with
    that seed, for any draft length, including "auto" (whose lengths follow timings)."""
    params = GenerationParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, max_tokens=40, seed=3)
    prompt = PROMPTS[2]
    plain = engines["none"].generate(prompt, params).tokens
    for draft_max in ("auto", 2, 6):
        assert engines["ngram"].generate(prompt, params, draft_max=draft_max).tokens == plain
    assert engines["ngram"].generate(prompt, params, draft_max=6).stats.drafted > 0


def test_one_engine_thread_loads_serves_and_frees(tiny_model_path, tmp_path) -> None:
    import threading

    from localspec.errors import LocalspecError

    before = {t.ident for t in threading.enumerate()}
    bad = tmp_path / "not-a-model.gguf"
    bad.write_text("hello")
    with pytest.raises(LocalspecError):  # a load error reaches the caller ...
        Engine.load(bad, draft="none")
    assert {t.ident for t in threading.enumerate()} == before  # ... and leaves no thread behind
    engine = Engine.load(tiny_model_path, draft="ngram", n_ctx=256)
    assert len({t.ident for t in threading.enumerate()} - before) == 1  # one engine thread
    assert engine.generate("the cat", max_tokens=4, temperature=0.0).stats.n_tokens == 4
    engine.close()
    assert {t.ident for t in threading.enumerate()} == before


@pytest.mark.parametrize("drafter", ["ngram", "model", "hybrid"])
def test_stats_count_drafts_by_kind(engines, drafter: str) -> None:
    """Lookups and model drafts are counted apart (the server's /metrics reports them by kind):
    the kinds add up to the totals, and each drafter fills only the kinds it drafts."""
    runs = [engines[drafter].generate(p, GREEDY, draft_max=4).stats for p in PROMPTS]
    drafted = {k: sum(s.drafted_by_kind[k] for s in runs) for k in runs[0].drafted_by_kind}
    accepted = {k: sum(s.accepted_by_kind[k] for s in runs) for k in runs[0].accepted_by_kind}
    assert sum(drafted.values()) == sum(s.drafted for s in runs)
    assert sum(accepted.values()) == sum(s.accepted for s in runs)
    assert {k for k, n in drafted.items() if n} == {"ngram": {"ngram"}, "model": {"model"},
                                                     "hybrid": {"ngram", "model"}}[drafter]
    assert all(accepted[k] <= drafted[k] for k in drafted)
    assert drafted["model"] == sum(s.model_drafted for s in runs)
    assert runs[-1].last_drafted <= 4
