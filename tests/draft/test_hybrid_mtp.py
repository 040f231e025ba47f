"""MTP drafting on a hybrid target (issue 15): a tiny generated Qwen3.5 (``qwen35``: gated
delta-net blocks between attention blocks) with its NextN block, the first MTP family.

The trunk's recurrent state rolls back through llama.cpp's snapshots (tests/core/test_hybrid.py);
the NextN block runs in its own context with a plain KV cache. Greedy output equals plain
decoding exactly (the layers alone and chained with n-gram, fixed k and the controller), and
sampling follows the target's distribution: the second token's too, which is drawn from the
state left by a rollback after the first.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from localspec.runtime.convert import params_to_core, stats_from_core
from localspec.runtime.engine import Engine
from localspec.testing.qwen35 import Qwen35Spec, write_qwen35_model
from localspec.types import GenerationParams
from tests.fixtures.helpers import mtp_core_alone
from tests.fixtures.stats_helpers import UNTRUNCATED, assert_first_two_tokens_fit

GREEDY = GenerationParams(temperature=0.0, max_tokens=200, ignore_eos=True)
PROMPT = "the quick brown fox jumps over the lazy dog and the speculative"


@pytest.fixture(scope="module")
def target(model_dir: Path) -> Path:
    return write_qwen35_model(model_dir / "tiny-qwen35-mtp.gguf",
                              Qwen35Spec(divergence=0.3, with_mtp=True))


@pytest.fixture(scope="module")
def plain(target: Path):  # type: ignore[no-untyped-def]
    engine = Engine.load(target, draft="none", n_ctx=1024, n_threads=1)
    yield engine
    engine.close()


def load(target: Path, draft: str = "mtp") -> Engine:
    return Engine.load(target, draft=draft, n_ctx=1024, draft_p_min=0.0, n_threads=1)


@pytest.mark.parametrize("draft", ["mtp", "auto"])
@pytest.mark.parametrize("draft_max", [3, "auto"])
def test_greedy_output_equals_plain(plain: Engine, target: Path, draft: str,
                                    draft_max: int | str) -> None:
    expected = plain.generate(PROMPT, GREEDY).tokens
    with load(target, draft) as engine:
        assert engine.info.drafter == "mtp" and engine.info.memory == "hybrid"
        got = engine.generate(PROMPT, replace(GREEDY, draft_max=draft_max))
    assert got.tokens == expected
    if draft_max == 3:  # ("auto" may judge the layers not worth their pass on this tiny model)
        assert got.stats.model_drafted > 50 and got.stats.rejected > 20
        assert got.stats.accepted > 20


def test_the_layers_alone_equal_plain(plain: Engine, target: Path) -> None:
    """Without the n-gram lookup in front: every draft is the NextN block's."""
    core = mtp_core_alone(target)
    prompt = plain.tokenize(PROMPT)
    try:
        for draft_max in (3, 5):
            raw = core.generate(params_to_core(replace(GREEDY, draft_max=draft_max), prompt), None)
            stats = stats_from_core(raw["stats"])
            assert list(raw["tokens"]) == plain.generate(prompt, GREEDY).tokens
            assert stats.model_drafted == stats.drafted > 150 and stats.rejected > 10
    finally:
        core.close()


def test_sampling_follows_the_target_distribution(plain: Engine, target: Path) -> None:
    params = GenerationParams(max_tokens=2, **UNTRUNCATED)
    prompt = plain.tokenize("zq the quick brown fox")
    with load(target) as engine:
        outputs = [engine.generate(prompt, params, seed=s, draft_max=3) for s in range(1500)]
    drafted = sum(o.stats.drafted for o in outputs)
    accepted = sum(o.stats.accepted for o in outputs)
    assert drafted > 1000 and 50 < accepted < drafted - 50  # both rules' branches ran
    assert_first_two_tokens_fit(plain, prompt, outputs)
