"""Predicted Outputs on the server (OpenAI's ``prediction``), through the official `openai`
client: the output is the same as without a prediction, usage reports the accepted and
rejected prediction tokens under OpenAI's names, and a malformed prediction is a 400 naming it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from localspec.runtime.engine import Engine
from localspec.server import create_app
from localspec.server.background import BackgroundServer
from localspec.server.options import ServerOptions

PROMPT = "the quick brown fox jumps over the lazy dog. the quick brown fox"


@pytest.fixture(scope="module")
def engine(tiny_model_path: Path) -> Iterator[Engine]:
    loaded = Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def server(engine: Engine) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(engine, ServerOptions())) as running:
        yield running


@pytest.fixture
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", timeout=60, max_retries=0)


def completion(client: openai.OpenAI, engine: Engine, **extra: Any) -> Any:
    return client.completions.create(
        model=engine.info.target_name, prompt=PROMPT, temperature=0, max_tokens=40,
        extra_body={"draft_max": 6, "ignore_eos": True, **extra},
    )


def test_a_prediction_keeps_the_output_and_reports_its_tokens(client: openai.OpenAI,
                                                             engine: Engine) -> None:
    plain = completion(client, engine)
    text = plain.choices[0].text
    # The tiny model's output is not always valid UTF-8: predict the tokens its text gives back.
    predicted = completion(client, engine, prediction={"type": "content", "content": text})
    assert predicted.choices[0].text == text
    details = predicted.usage.completion_tokens_details
    ext = (predicted.model_extra or {})["localspec"]
    assert details.accepted_prediction_tokens == ext["accepted_by_kind"]["prediction"]
    assert (details.accepted_prediction_tokens + details.rejected_prediction_tokens
            == ext["drafted_by_kind"]["prediction"] > 0)
    assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0
    assert plain.usage.completion_tokens_details.rejected_prediction_tokens == 0
    # Text parts are one text, as OpenAI reads them.
    parts = [{"type": "text", "text": text[:10]}, {"type": "text", "text": text[10:]}]
    in_parts = completion(client, engine, prediction={"type": "content", "content": parts})
    assert in_parts.choices[0].text == text
    assert in_parts.usage.completion_tokens_details == details


def test_chat_takes_a_prediction_from_the_openai_client(client: openai.OpenAI,
                                                        engine: Engine) -> None:
    messages: Any = [{"role": "user", "content": "Rename x to y: def f(x): return x"}]
    name = engine.info.target_name
    plain = client.chat.completions.create(model=name, messages=messages, temperature=0,
                                           max_tokens=30, extra_body={"draft_max": 6})
    text = plain.choices[0].message.content or ""
    predicted = client.chat.completions.create(
        model=name, messages=messages, temperature=0, max_tokens=30,
        prediction={"type": "content", "content": text}, extra_body={"draft_max": 6},
    )
    assert predicted.choices[0].message.content == text
    assert predicted.usage is not None and predicted.usage.completion_tokens_details is not None
    assert predicted.usage.completion_tokens_details.rejected_prediction_tokens is not None
    # Streamed, with usage: the same numbers on the usage chunk.
    stream = client.chat.completions.create(
        model=name, messages=messages, temperature=0, max_tokens=30, stream=True,
        stream_options={"include_usage": True}, prediction={"type": "content", "content": text},
        extra_body={"draft_max": 6},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens_details == predicted.usage.completion_tokens_details


@pytest.mark.parametrize("prediction", [
    {"type": "text", "content": "x"},
    {"content": "x"},
    {"type": "content", "content": 5},
    {"type": "content", "content": [{"type": "image_url", "image_url": "x"}]},
    {"type": "content", "content": "x", "extra": 1},
    "just text",
])
def test_a_malformed_prediction_is_a_400_naming_it(server: BackgroundServer, engine: Engine,
                                                   prediction: Any) -> None:
    body = {"model": engine.info.target_name, "prompt": PROMPT, "max_tokens": 4,
            "prediction": prediction}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] is not None and error["param"].startswith("prediction"), error


def test_a_prediction_over_the_context_is_a_400(server: BackgroundServer, engine: Engine) -> None:
    body = {"model": engine.info.target_name, "prompt": PROMPT, "max_tokens": 4,
            "prediction": {"type": "content", "content": " fox" * 2000}}
    response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "prediction" and "context" in error["message"], error
