"""Targets whose memory cannot drop a suffix (a tiny ``mamba`` GGUF written by the suite).

A recurrent model keeps one running state, and Mamba keeps no snapshots of it, so llama.cpp
refuses to remove its last positions. The core checks that result (``Context::truncate``): a
request that shares only part of the cached history starts over instead of decoding onto a
stale state, the step drafts nothing (rollback depth 0), and the loader turns the default
n-gram drafter off (with a notice) or refuses a draft model (exit 2). Hybrid targets whose
state llama.cpp can take back are in test_hybrid.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec import _core
from localspec.errors import ModelLoadError
from localspec.runtime.engine import Engine
from localspec.testing.recurrent import write_mamba_model
from localspec.testing.synthetic import TinyConfig
from tests.fixtures.helpers import run_localspec as localspec

PROMPT = "the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the"


@pytest.fixture(scope="module")
def mamba_path(model_dir: Path) -> Path:
    return write_mamba_model(model_dir / "tiny-mamba.gguf", TinyConfig(seed=11))


@pytest.fixture(scope="module")
def mamba(mamba_path: Path) -> Iterator[Engine]:
    engine = Engine.load(mamba_path, draft="none", n_ctx=512, n_threads=1)
    yield engine
    engine.close()


def fresh_greedy(path: Path, prompt: str, max_tokens: int) -> list[int]:
    with Engine.load(path, draft="none", n_ctx=512, n_threads=1) as engine:
        return engine.generate(prompt, max_tokens=max_tokens, temperature=0).tokens


def test_memory_kind(mamba_path: Path, tiny_model_path: Path, mamba: Engine) -> None:
    assert _core.memory_kind(str(mamba_path)) == "recurrent"
    assert _core.memory_kind(str(tiny_model_path)) == "attention"
    assert mamba.info.memory == "recurrent" and mamba.info.notice == ""


def test_plain_generation_reuses_or_restarts_the_state(mamba_path: Path, mamba: Engine) -> None:
    first = mamba.generate(PROMPT, max_tokens=24, temperature=0, ignore_eos=True)
    assert first.stats.n_tokens == 24 and first.text
    # Another prompt shares only part of the cached history: the state cannot lose its
    # tail, so the engine must start over; then the first prompt again, same answer.
    other = mamba.generate("hello world, this is", max_tokens=24, temperature=0, ignore_eos=True)
    again = mamba.generate(PROMPT, max_tokens=24, temperature=0, ignore_eos=True)
    assert again.tokens == first.tokens
    assert other.tokens == fresh_greedy(mamba_path, "hello world, this is", 24)
    # Sampling works too and is reproducible by seed.
    a = mamba.generate(PROMPT, max_tokens=16, temperature=0.9, seed=5, ignore_eos=True)
    b = mamba.generate(PROMPT, max_tokens=16, temperature=0.9, seed=5, ignore_eos=True)
    assert a.tokens == b.tokens


def test_logits_after_a_longer_history(mamba: Engine) -> None:
    """next_token_logits over a shorter prefix than the cache holds: the cache restarts."""
    tokens = mamba.tokenize(PROMPT)
    full = mamba.next_token_logits(tokens)
    shorter = mamba.next_token_logits(tokens[:-3])
    assert mamba.next_token_logits(tokens[:-3]).tolist() == shorter.tolist()
    assert mamba.next_token_logits(tokens).argmax() == full.argmax()


def test_ngram_drafter_is_turned_off_with_a_notice(mamba_path: Path, mamba: Engine) -> None:
    plain = mamba.generate(PROMPT, max_tokens=40, temperature=0, ignore_eos=True)
    with Engine.load(mamba_path, draft="ngram", n_ctx=512, n_threads=1) as engine:
        assert engine.info.drafter == "none"
        assert "recurrent" in engine.info.notice and "plainly" in engine.info.notice
        out = engine.generate(PROMPT, max_tokens=40, temperature=0, ignore_eos=True, draft_max=4)
    assert out.stats.drafted == 0 and out.tokens == plain.tokens


def test_the_core_never_drafts_what_it_cannot_take_back(mamba_path: Path) -> None:
    """The core itself (no loader check): Mamba keeps no snapshots of its state (rollback
    depth 0), so the step caps every draft at 0 tokens, even a fixed-length one, instead of
    continuing from a state it could not roll back."""
    options = _core.EngineOptions()
    options.target_path, options.drafter_kind, options.n_ctx, options.n_threads = (
        str(mamba_path), "ngram", 512, 1
    )
    core = _core.Core(options)
    try:
        assert core.rollback_depth() == 0
        request = _core.GenerateRequest()
        request.prompt = core.tokenize(PROMPT * 3, True, True)
        request.sampling = _core.SamplingParams(temperature=0.0)
        request.max_tokens, request.draft_max, request.ignore_eos = 64, 8, True
        request.adaptive = False  # would always draft what the lookup offers
        result = core.generate(request)
    finally:
        core.close()
    assert result["stats"].drafted == 0
    assert result["tokens"] == fresh_greedy(mamba_path, PROMPT * 3, 64)


def test_draft_models_are_refused(mamba_path: Path, tiny_model_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="recurrent model.*cannot verify a draft model"):
        Engine.load(mamba_path, draft=tiny_model_path, n_ctx=512, n_threads=1)
    with pytest.raises(ModelLoadError, match="draft model .* is a recurrent model"):
        Engine.load(tiny_model_path, draft=f"hybrid:{mamba_path}", n_ctx=512, n_threads=1)


def test_cli(mamba_path: Path, tiny_model_path: Path) -> None:
    common = ["run", "the quick brown", "--max-tokens", "8", "--threads", "1"]
    ok = localspec(*common, "--target", str(mamba_path))
    assert ok.returncode == 0, ok.stderr
    assert "speculation is off" in ok.stderr and "drafter none" in ok.stderr
    refused = localspec(*common, "--target", str(mamba_path), "--draft", str(tiny_model_path))
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert "--draft none" in refused.stderr
