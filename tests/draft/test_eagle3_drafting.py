"""EAGLE-3 drafting through the core (docs/design.md, "Hidden-state drafting"): tiny random
heads on the tiny target. Whatever the head drafts, the output is the target's: greedy output
equals plain decoding token for token (with and without a d2t draft vocabulary, fixed k and
the controller, across requests that reuse the cache, prompts longer than one head batch), and
sampling follows the target's distribution. As everywhere (tests/core/test_generation.py), a greedy
divergence is allowed only as a numerical tie that the target's same-shape replay confirms."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from localspec import _core
from localspec.bench.lossless import compare_greedy
from localspec.errors import LocalspecError
from localspec.runtime.engine import Engine
from localspec.testing.heads import HeadSpec, write_eagle3_head
from localspec.testing.synthetic import TinyConfig, write_model
from localspec.types import GenerationParams
from tests.fixtures.stats_helpers import UNTRUNCATED, assert_first_two_tokens_fit

GREEDY = GenerationParams(temperature=0.0, max_tokens=300, ignore_eos=True)
PROMPT = "the quick brown fox jumps over the lazy dog and the speculative"


@pytest.fixture(scope="module")
def heads(model_dir: Path, tiny_model_path: Path) -> dict[str, Path]:
    return {
        "d2t": write_eagle3_head(model_dir / "e3-d2t.gguf", tiny_model_path,
                                 HeadSpec(draft_vocab=128, seed=3)),
        # The whole vocabulary and a flatter output: more of its drafts are accepted.
        "full": write_eagle3_head(
            model_dir / "e3-full.gguf", tiny_model_path, HeadSpec(draft_vocab=0, scale=0.3, seed=4)
        ),
        "flat-d2t": write_eagle3_head(
            model_dir / "e3-flat-d2t.gguf",
            tiny_model_path,
            HeadSpec(draft_vocab=200, scale=0.3, seed=6),
        ),
    }


@pytest.fixture(scope="module")
def plain(tiny_model_path: Path):
    engine = Engine.load(tiny_model_path, draft="none", n_ctx=1024)
    yield engine
    engine.close()


def assert_same_or_tie(plain: Engine, prompt: str | list[int], expected: list[int], result) -> None:
    tokens = plain.tokenize(prompt) if isinstance(prompt, str) else prompt
    divergence = compare_greedy(plain, tokens, expected, result)
    assert divergence is None or divergence.verdict == "tie", divergence


def load(target: Path, head: Path, prefix: str = "eagle3:") -> Engine:
    return Engine.load(target, draft=f"{prefix}{head}", n_ctx=1024, draft_p_min=0.0)


@pytest.mark.parametrize("head", ["d2t", "full"])
@pytest.mark.parametrize("draft_max", [3, "auto"])
def test_greedy_output_equals_plain(plain, heads, tiny_model_path, head: str, draft_max) -> None:
    engine = load(tiny_model_path, heads[head])
    try:
        expected = plain.generate(PROMPT, GREEDY)
        got = engine.generate(PROMPT, GREEDY, draft_max=draft_max)
        assert_same_or_tie(plain, PROMPT, expected.tokens, got)
        if draft_max == 3:
            assert got.stats.drafted > 200 and got.stats.rejected > 0  # rollbacks happened
    finally:
        engine.close()


def test_the_head_is_accepted_sometimes(heads, tiny_model_path) -> None:
    """The full-vocabulary head is right often enough that accepted drafts (not only
    rejections) cross the step's rollback: the identity above covers both paths."""
    engine = load(tiny_model_path, heads["full"])
    try:
        prompt = "zq " * 3 + PROMPT  # few n-gram matches: the head drafts
        result = engine.generate(prompt, GREEDY, draft_max=3)
        assert result.stats.accepted > 5
    finally:
        engine.close()


def test_batched_generations_draft_from_their_own_features(plain, heads,
                                                           tiny_model_path) -> None:
    """Four generations share the target's passes, each with a head context of its own slot
    reading that generation's features: every result equals plain decoding, and each drafts
    and is accepted exactly as alone (fixed draft length), which it could not if a slot read
    another generation's features."""
    prompts = ["zq " * 3 + PROMPT, "zq the quick brown fox", "hello world, this is", PROMPT]
    params = [replace(GREEDY, max_tokens=60 + 9 * i, draft_max=3) for i in range(len(prompts))]
    draft = f"eagle3:{heads['full']}"
    with Engine.load(tiny_model_path, draft=draft, n_ctx=1024, draft_p_min=0.0) as solo:
        alone = [solo.generate(p, q) for p, q in zip(prompts, params, strict=True)]
    with Engine.load(tiny_model_path, draft=draft, n_ctx=1024, draft_p_min=0.0,
                     parallel=4) as engine:
        assert engine.info.parallel == 4 and engine.info.notice == ""
        handles = [engine.submit(p, q) for p, q in zip(prompts, params, strict=True)]
        results = [h.result(timeout=300) for h in handles]
    for prompt, q, got in zip(prompts, params, results, strict=True):
        assert_same_or_tie(plain, prompt, plain.generate(prompt, replace(q, draft_max=0)).tokens,
                           got)
    assert [(r.stats.drafted, r.stats.accepted) for r in results] == [
        (a.stats.drafted, a.stats.accepted) for a in alone]
    assert sum(r.stats.model_drafted for r in results) > 100


def test_cache_reuse_long_prompts_and_cancel(plain, heads, tiny_model_path) -> None:
    """Requests that share a prefix, one that rewrites an old prefix, and a prompt longer than
    one head batch (64 rows): each equals plain decoding."""
    engine = load(tiny_model_path, heads["full"])
    long_prompt = list(range(5, 300)) * 2 + list(range(7, 120))  # 703 tokens
    short = GenerationParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    try:
        for prompt in [PROMPT, PROMPT + " and again", long_prompt, "zq " + PROMPT, PROMPT]:
            got = engine.generate(prompt, short, draft_max=4)
            assert_same_or_tie(plain, prompt, plain.generate(prompt, short).tokens, got)
        stream = engine.stream(PROMPT, short, draft_max=4)
        next(stream)
        stream.close()  # cancelled mid-generation; the next request still matches
        got = engine.generate(PROMPT, short, draft_max=4)
        assert_same_or_tie(plain, PROMPT, plain.generate(PROMPT, short).tokens, got)
    finally:
        engine.close()


def test_spellings_of_a_head(plain, heads, tiny_model_path) -> None:
    """hybrid:HEAD is eagle3:HEAD (n-gram first, the head otherwise); a bare head path drafts
    with the head alone (as a bare draft model path does), and is still lossless."""
    engine = load(tiny_model_path, heads["d2t"], prefix="hybrid:")
    try:
        assert str(engine.info.drafter) == f"eagle3:{heads['d2t']}"
    finally:
        engine.close()
    engine = load(tiny_model_path, heads["full"], prefix="")
    try:
        assert str(engine.info.drafter) == str(heads["full"])
        prompt = "the cat sat on the mat and the cat sat on the mat and the cat sat on"
        got = engine.generate(prompt, GREEDY, draft_max=3)
        # Every draft comes from the head (n-gram lookups would be free: model_drafted counts
        # only drafts that ran a model).
        assert got.stats.model_drafted == got.stats.drafted > 0
        assert_same_or_tie(plain, prompt, plain.generate(prompt, GREEDY).tokens, got)
    finally:
        engine.close()


def test_sampling_follows_the_target_distribution(plain, heads, tiny_model_path) -> None:
    """First and second tokens over many seeds fit the target's warped distribution, with the
    head's q (mapped through d2t) in the rejection rule."""
    # No truncation: the head's q then overlaps the target's p enough for acceptances.
    params = GenerationParams(max_tokens=2, **UNTRUNCATED)
    engine = load(tiny_model_path, heads["flat-d2t"])  # q lives on 200 of the 300 tokens
    try:
        prompt = engine.tokenize("zq the quick brown fox")
        outputs = [engine.generate(prompt, params, seed=seed, draft_max=3)
                   for seed in range(2000)]
    finally:
        engine.close()
    drafted = sum(o.stats.drafted for o in outputs)
    accepted = sum(o.stats.accepted for o in outputs)
    assert drafted > 1500 and 50 < accepted < drafted - 50
    assert_first_two_tokens_fit(plain, prompt, outputs)


def test_the_controller_turns_a_useless_head_off(heads, tiny_model_path) -> None:
    """A head whose drafts are (almost) never accepted is turned off by its acceptance record,
    not by timings: the steps of a fixed-length run are scored against what the target
    produced, that record says the head is useless, and "auto" then drafts with it only on
    rechecks (one token after 32, 64, 128 ... declined steps), however the passes are timed."""
    engine = load(tiny_model_path, heads["d2t"])
    # Sampled text rarely repeats, so n-gram lookups rarely propose: the head does the drafting.
    params = GenerationParams(
        temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=400, ignore_eos=True, seed=5
    )
    try:
        fixed = engine.generate(PROMPT, params, draft_max=3)
        record = engine.learned()
        auto = engine.generate(PROMPT, params, draft_max="auto", reuse_cache=False)
    finally:
        engine.close()
    assert fixed.stats.model_drafted > 600 and fixed.stats.acceptance_rate < 0.1
    judge = _core.testing.DraftController(len(record.trials[0]))
    judge.restore(record)
    assert record.evidence_trials[0] > 20 and not judge.worth_probing(0)  # the head's slot
    # At most one recheck per 32 steps (a hit only brings the next one back to 32 steps): a
    # count, not a time. A controller that did not turn the head off would draft ~1000.
    assert auto.stats.model_drafted <= 400 // 32


def test_a_head_for_another_target_is_refused(model_dir: Path, heads, tiny_model_path) -> None:
    wide = write_model(model_dir / "tiny-wide.gguf", TinyConfig(n_embd=96, n_head=4, n_head_kv=2))
    with pytest.raises(LocalspecError, match="hidden size 64, but .* has 96; use a head made"):
        load(wide, heads["d2t"])
    deep = write_eagle3_head(model_dir / "e3-deep.gguf", tiny_model_path,
                             HeadSpec(target_layers=(1, 2, 9)))
    with pytest.raises(LocalspecError, match="reads layer 9, but .* has layers 0..3"):
        load(tiny_model_path, deep)
    first = write_eagle3_head(model_dir / "e3-layer0.gguf", tiny_model_path,
                              HeadSpec(target_layers=(0, 1, 2)))
    with pytest.raises(LocalspecError, match="reads layer 0"):
        load(tiny_model_path, first)


def test_eagle3_prefix_on_a_model_is_refused(tiny_model_path, tiny_draft_path) -> None:
    with pytest.raises(LocalspecError, match="is not an EAGLE-3 head"):
        load(tiny_model_path, tiny_draft_path)


def test_the_graph_tap_equals_llamas_own_extraction(tiny_model_path) -> None:
    """The tap reads "l_out-<il-1>" for layer il's input on any architecture; where llama.cpp
    publishes layer inputs itself (llama does), both give the same bits."""
    tokens = [1, 5, 9, 20, 33, 7, 7, 140]
    tapped = _core.testing.layer_inputs(str(tiny_model_path), tokens, [1, 2, 3], False)
    extracted = _core.testing.layer_inputs(str(tiny_model_path), tokens, [1, 2, 3], True)
    assert tapped.shape == (len(tokens), 3 * 64)
    assert np.array_equal(tapped, extracted)
    assert not np.array_equal(tapped[:, :64], tapped[:, 64:128])  # different layers


HIDDEN_EXT = """
import sys
from localspec import _core
from localspec.runtime.engine import Engine
from localspec.errors import LocalspecError
target, head = sys.argv[1], sys.argv[2]
try:
    _core.testing.layer_inputs(target, [1, 2], [1], True)
except LocalspecError as error:
    print("cross-check:", error)
engine = Engine.load(target, draft="eagle3:" + head, n_ctx=256, draft_p_min=0.0)
result = engine.generate("the quick", temperature=0.0, max_tokens=20, draft_max=3)
print("drafted", result.stats.drafted)
engine.close()
"""


def test_a_libllama_without_the_extensions(heads, tiny_model_path) -> None:
    """Without llama.cpp's C++-only extension functions, `import localspec` and EAGLE-3
    drafting (which reads the tap, not them) work; the cross-check says what is missing."""
    env = dict(os.environ, LOCALSPEC_HIDE_LLAMA_EXT="1")
    args = [sys.executable, "-c", HIDDEN_EXT, str(tiny_model_path), str(heads["d2t"])]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "cross-check: this libllama does not export llama_set_embeddings" in proc.stdout
    assert "drafted " in proc.stdout and "drafted 0" not in proc.stdout
