"""usage.completion_tokens counts the tokens whose text the client receives: a stop string that
cuts a speculative step's tail leaves the cut tokens out (real engine, real server, openai)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from localspec.runtime.engine import Engine
from localspec.runtime.engine_loop import text_tokens
from localspec.server import create_app
from localspec.server.background import BackgroundServer

PROMPT = "the quick brown fox jumps over the lazy dog. the quick brown fox"


@pytest.fixture(scope="module")
def engine(tiny_model_path: Path) -> Iterator[Engine]:
    loaded = Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1)
    yield loaded
    loaded.close()


def stop_inside(engine: Engine) -> tuple[str, int]:
    """A stop string that starts a few tokens into the greedy continuation, and how many tokens
    come before the token where it starts (which are all the client can receive)."""
    tokens = engine.generate(PROMPT, temperature=0, max_tokens=40, ignore_eos=True).tokens
    for n in range(6, len(tokens) - 2):
        before, after = engine.detokenize(tokens[:n]), engine.detokenize(tokens[: n + 2])
        stop = after[len(before):]
        if stop.strip() and "\ufffd" not in stop and stop not in before:
            return stop, n
    raise AssertionError("no usable stop string in the continuation")


def test_text_tokens_leaves_out_the_cut_tail(engine: Engine) -> None:
    stop, kept = stop_inside(engine)
    result = engine.generate(PROMPT, temperature=0, max_tokens=40, stop=(stop,), draft_max=8)
    assert result.finish_reason == "stop" and len(result.tokens) > kept
    assert result.text_tokens == result.completion_tokens == kept
    assert text_tokens(engine.detokenize, result.tokens, result.text) == kept
    plain = engine.generate(PROMPT, temperature=0, max_tokens=12, ignore_eos=True)
    assert plain.text_tokens is None and plain.completion_tokens == 12


def test_server_usage_counts_what_the_client_receives(engine: Engine) -> None:
    stop, kept = stop_inside(engine)
    with BackgroundServer(create_app(engine)) as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", timeout=30,
                               max_retries=0)
        response = client.completions.create(model="tiny-target", prompt=PROMPT, max_tokens=40,
                                             temperature=0, stop=[stop])
        streamed = list(client.completions.create(
            model="tiny-target", prompt=PROMPT, max_tokens=40, temperature=0, stop=[stop],
            stream=True, stream_options={"include_usage": True}))
    assert response.usage is not None and response.usage.completion_tokens == kept
    assert response.choices[0].text == engine.detokenize(
        engine.generate(PROMPT, temperature=0, max_tokens=kept, speculative=False).tokens)
    usage = streamed[-1].usage
    assert usage is not None and usage.completion_tokens == kept
