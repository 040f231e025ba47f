"""logprobs / top_logprobs from the verification rows: equal to plain decoding's values (to
the numerics of batched vs single-row passes), in the engine and over HTTP (OpenAI shapes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest

from localspec.runtime.engine import Engine
from localspec.server import create_app
from localspec.server.background import BackgroundServer
from localspec.types import GenerationParams

PROMPT = "the cat sat on the mat and the cat sat on the"
PARAMS = GenerationParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=True,
                          top_logprobs=3)
TOLERANCE = 2e-3  # batched and single-row passes differ in the low bits


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    return x - x.max() - np.log(np.exp(x - x.max()).sum())


@pytest.mark.parametrize("drafter", ["model", "self"])
def test_speculative_logprobs_equal_plain(engines, drafter: str) -> None:
    plain = engines["none"].generate(PROMPT, PARAMS)
    spec = engines[drafter].generate(PROMPT, PARAMS, draft_max=4)
    assert spec.stats.accepted > 0 and spec.tokens == plain.tokens
    assert plain.logprobs is not None and spec.logprobs is not None
    assert [lp.token for lp in spec.logprobs] == spec.tokens
    for a, b in zip(plain.logprobs, spec.logprobs, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=TOLERANCE)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        assert np.allclose([v for _, v in a.top], [v for _, v in b.top], atol=TOLERANCE)


def test_logprobs_are_the_targets_log_softmax(engines) -> None:
    engine = engines["self"]
    result = engine.generate(PROMPT, PARAMS, draft_max=4)
    assert result.logprobs is not None
    context = engine.tokenize(PROMPT)
    for token, lp in zip(result.tokens[:6], result.logprobs, strict=False):
        expected = log_softmax(engine.next_token_logits(context))
        assert lp.logprob == pytest.approx(expected[token], abs=TOLERANCE)
        top = np.argsort(-expected, kind="stable")[:3]
        assert [t for t, _ in lp.top] == list(top)
        assert lp.top[0][0] == token  # greedy: the chosen token is the most likely
        context.append(token)


def test_streamed_chunks_carry_their_tokens_logprobs(engines) -> None:
    chunks = list(engines["self"].stream(PROMPT, PARAMS, draft_max=4))
    assert all(c.logprobs is not None and len(c.logprobs) == len(c.tokens) for c in chunks)
    assert any(len(c.tokens) > 1 for c in chunks)


def test_no_logprobs_unless_asked(engines) -> None:
    assert engines["self"].generate(PROMPT, PARAMS, logprobs=False).logprobs is None


@pytest.fixture(scope="module")
def server(tiny_model_path: Path, tiny_draft_path: Path) -> Iterator[BackgroundServer]:
    engine = Engine.load(tiny_model_path, draft=tiny_draft_path, n_ctx=512, n_threads=1,
                         draft_p_min=0.0)
    with BackgroundServer(create_app(engine)) as running:
        running.engine = engine  # type: ignore[attr-defined]
        yield running
    engine.close()


def test_http_chat_and_completion_logprobs_equal_plain(server: BackgroundServer) -> None:
    engine: Engine = server.engine  # type: ignore[attr-defined]
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
    model = engine.info.target_name
    plain = engine.generate(PROMPT, PARAMS, speculative=False)
    assert plain.logprobs is not None
    completion = client.completions.create(
        model=model, prompt=PROMPT, temperature=0, max_tokens=24, logprobs=3,
        extra_body={"ignore_eos": True, "draft_max": 4},
    )
    got = completion.choices[0].logprobs
    assert got is not None and got.token_logprobs is not None and got.top_logprobs is not None
    assert np.allclose(got.token_logprobs, [lp.logprob for lp in plain.logprobs], atol=TOLERANCE)
    assert len(got.top_logprobs[0]) == 3
    assert len(got.tokens or []) == 24  # one entry per generated token

    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], temperature=0, max_tokens=16,
        logprobs=True, top_logprobs=2, stream=True, extra_body={"draft_max": 4},
    )
    content = [e for c in stream if c.choices and c.choices[0].logprobs
               for e in (c.choices[0].logprobs.content or [])]
    whole = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], temperature=0, max_tokens=16,
        logprobs=True, top_logprobs=2, extra_body={"speculative": False},
    )
    reference = whole.choices[0].logprobs
    assert reference is not None and reference.content
    assert [e.token for e in content][: len(reference.content)] == [
        e.token for e in reference.content
    ]
    for a, b in zip(content, reference.content, strict=False):
        assert a.logprob == pytest.approx(b.logprob, abs=TOLERANCE)
        assert len(a.top_logprobs) == 2 and a.bytes == list(a.token.encode("utf-8"))
