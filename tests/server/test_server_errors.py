"""`localspec serve` failure paths and metrics, on a real server over a real engine: OpenAI
error JSON for every bad request (and the server stays up), 429 + Retry-After from the bounded
queue, cancellation on disconnect, and /metrics counters checked against the responses."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from localspec.runtime.engine import Engine
from localspec.server import create_app
from localspec.server.background import BackgroundServer
from localspec.server.options import ServerOptions

API_KEY = "sk-errors"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
LONG = {"max_tokens": 3000, "ignore_eos": True, "temperature": 0}  # seconds of work


@pytest.fixture(scope="module")
def engine(tiny_model_path: Path, tiny_draft_path: Path) -> Iterator[Engine]:
    loaded = Engine.load(
        tiny_model_path, draft=tiny_draft_path, n_ctx=256, max_queue=8, n_threads=1
    )
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def busy_engine(tiny_model_path: Path) -> Iterator[Engine]:
    """A long context and a queue of one: easy to keep busy, easy to fill."""
    loaded = Engine.load(tiny_model_path, draft="ngram", n_ctx=4096, max_queue=1, n_threads=1)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def server(engine: Engine) -> Iterator[BackgroundServer]:
    app = create_app(engine, ServerOptions(api_key=API_KEY, max_request_bytes=4096))
    with BackgroundServer(app) as running:
        yield running


@pytest.fixture
def busy_server(busy_engine: Engine) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(busy_engine)) as running:
        yield running


def post(server: BackgroundServer, path: str, **kwargs: Any) -> httpx.Response:
    """POST a JSON body (``json=``, or raw bytes with ``content=``)."""
    headers = {"Content-Type": "application/json", **kwargs.pop("headers", AUTH)}
    return httpx.post(f"{server.base_url}{path}", headers=headers, timeout=30, **kwargs)


def chat_body(engine: Engine, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Hi"}]
    return {"model": engine.info.target_name, "messages": messages, "max_tokens": 4, **extra}


def assert_error(response: httpx.Response, status: int, **fields: Any) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    for key, value in fields.items():
        assert error[key] == value, (key, error)
    return error


BAD_CHAT = [
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages.0.role"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_k": -3}, "top_k"),
    ({"draft_max": 1000}, "draft_max"),
    ({"draft_max": "fast"}, "draft_max"),
    ({"seed": -1}, "seed"),
    ({"stop": [""]}, "stop"),
    ({"temperature": "hot"}, "temperature"),
    ({"n": 2}, "n"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"tools": [{"type": "function"}]}, "tools.0.function"),
    ({"frequency_penalty": 5.0}, "frequency_penalty"),
    ({"exact": True}, "exact"),  # this server runs in default mode
    ({"exact": "yes"}, "exact"),
    ({"grammar": "root ::= ("}, "grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "^a"}}}}}},
     "response_format"),
]


@pytest.mark.parametrize(("extra", "param"), BAD_CHAT)
def test_bad_chat_parameters_are_400(
    server: BackgroundServer, engine: Engine, extra: dict[str, Any], param: str
) -> None:
    body = {k: v for k, v in chat_body(engine, **extra).items() if v is not None}
    error = assert_error(post(server, "/v1/chat/completions", json=body), 400, param=param)
    assert error["type"] == "invalid_request_error"


def test_malformed_and_missing(server: BackgroundServer, engine: Engine) -> None:
    bad_json = post(server, "/v1/chat/completions", content=b'{"model": ')
    assert_error(bad_json, 400, code="invalid_json")
    assert_error(post(server, "/v1/chat/completions", content=b"[1, 2]"), 400, code="invalid_json")
    assert_error(post(server, "/v1/completions", content=b""), 400)
    assert_error(
        post(server, "/v1/completions", json={"prompt": "x"}), 400,
        param="model", code="missing_required_parameter",
    )


def test_unknown_model_is_404_for_the_openai_client(server: BackgroundServer) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gpt-9", prompt="x", max_tokens=2)
    assert caught.value.code == "model_not_found"


def test_prompt_over_context(server: BackgroundServer, engine: Engine) -> None:
    messages = [{"role": "user", "content": "word " * 400}]
    body = chat_body(engine, messages=messages)
    too_long = post(server, "/v1/chat/completions", json=body)
    assert_error(too_long, 400, code="context_length_exceeded", param="messages")
    ids = {"model": engine.info.target_name, "prompt": [1] * 300, "max_tokens": 2}
    assert_error(post(server, "/v1/completions", json=ids), 400, code="context_length_exceeded",
                 param="prompt")


def test_auth_size_limit_and_routing(server: BackgroundServer, engine: Engine) -> None:
    body = chat_body(engine)
    assert_error(post(server, "/v1/chat/completions", json=body, headers={}), 401)
    wrong = {"Authorization": "Bearer nope"}
    assert_error(post(server, "/v1/chat/completions", json=body, headers=wrong), 401)
    assert httpx.get(f"{server.base_url}/v1/models", timeout=10).status_code == 401
    assert httpx.get(f"{server.base_url}/metrics", timeout=10).status_code == 401
    big = chat_body(engine, messages=[{"role": "user", "content": "x" * 5000}])
    assert_error(post(server, "/v1/chat/completions", json=big), 413, code="request_too_large")
    missing = assert_error(httpx.get(f"{server.base_url}/v1/nothing", headers=AUTH), 404)
    assert missing["message"].startswith("This server has no GET /v1/nothing; it serves ")
    assert "POST /v1/chat/completions" in missing["message"]
    wrong_method = assert_error(httpx.get(f"{server.base_url}/v1/completions", headers=AUTH), 405)
    assert wrong_method["message"] == "GET /v1/completions is not supported: use POST."


def test_server_stays_up_after_errors(server: BackgroundServer, engine: Engine) -> None:
    for extra, _ in BAD_CHAT[:4]:
        post(server, "/v1/chat/completions", json=chat_body(engine, **extra))
    post(server, "/v1/chat/completions", content=b"{{{")
    response = post(server, "/v1/chat/completions", json=chat_body(engine, temperature=0))
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] is not None
    assert httpx.get(f"{server.base_url}/health", timeout=10).json()["status"] == "ok"


def test_full_queue_is_429_with_retry_after(
    busy_server: BackgroundServer, busy_engine: Engine
) -> None:
    handle = busy_engine.submit("Once upon a time", **LONG)
    try:
        body = {"model": busy_engine.info.target_name, "prompt": "x", "max_tokens": 2}
        response = post(busy_server, "/v1/completions", json=body, headers={})
        error = assert_error(response, 429, code="rate_limit_exceeded")
        assert int(response.headers["retry-after"]) >= 1
        assert error["type"] == "rate_limit_error"
    finally:
        handle.cancel()
    assert handle.result(timeout=30).finish_reason == "cancelled"


def wait_idle(engine: Engine, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while engine.queue_depth and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.queue_depth == 0, "the engine kept generating after the client left"


def cancelled_tokens(server: BackgroundServer) -> tuple[float, float]:
    metrics = scrape(server, headers={})
    key = "localspec_generations_total{endpoint=/v1/chat/completions,finish_reason=cancelled}"
    return metrics.get(key, 0), metrics["localspec_generated_tokens_total"]


def test_disconnect_mid_stream_stops_the_engine(
    busy_server: BackgroundServer, busy_engine: Engine
) -> None:
    body = chat_body(busy_engine, stream=True, **LONG)
    url = f"{busy_server.base_url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=30) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line).startswith("data: ")
        assert busy_engine.queue_depth == 1
    wait_idle(busy_engine)
    cancelled, generated = cancelled_tokens(busy_server)
    assert cancelled == 1 and generated < LONG["max_tokens"]


def test_disconnect_while_waiting_for_a_whole_answer(
    busy_server: BackgroundServer, busy_engine: Engine
) -> None:
    body = chat_body(busy_engine, **LONG)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{busy_server.base_url}/v1/chat/completions", json=body, timeout=0.5)
    wait_idle(busy_engine)
    cancelled, generated = cancelled_tokens(busy_server)
    assert cancelled == 1 and generated < LONG["max_tokens"]


def scrape(server: BackgroundServer, headers: dict[str, str] = AUTH) -> dict[str, float]:
    text = httpx.get(f"{server.base_url}/metrics", headers=headers, timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def test_metrics_match_the_responses(engine: Engine) -> None:
    with BackgroundServer(create_app(engine)) as fresh:
        client = openai.OpenAI(base_url=f"{fresh.base_url}/v1", api_key="x", max_retries=0)
        name = engine.info.target_name
        messages = [{"role": "user", "content": "Tell me about cats"}]
        usages, extensions = [], []
        for _ in range(2):
            r = client.chat.completions.create(model=name, messages=messages, max_tokens=12)
            usages.append(r.usage)
            extensions.append(r.model_extra["localspec"])
        r2 = client.completions.create(model=name, prompt="Hello", max_tokens=9, temperature=0)
        usages.append(r2.usage)
        extensions.append(r2.model_extra["localspec"])
        chunks = list(client.chat.completions.create(
            model=name, messages=messages, max_tokens=7, stream=True,
            stream_options={"include_usage": True},
        ))
        usages.append(chunks[-1].usage)
        extensions.append(chunks[-1].model_extra["localspec"])
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model=name, prompt="x", max_tokens=2, n=3)
        got = scrape(fresh, headers={})

    def total(key: str) -> float:
        return float(sum(e[key] for e in extensions))

    assert got["localspec_prompt_tokens_total"] == sum(u.prompt_tokens for u in usages)
    assert got["localspec_generated_tokens_total"] == sum(u.completion_tokens for u in usages)
    assert got["localspec_drafted_tokens_total"] == total("drafted")
    assert got["localspec_accepted_tokens_total"] == total("accepted")
    rate = total("accepted") / total("drafted") if total("drafted") else 0.0
    assert got["localspec_acceptance_rate"] == pytest.approx(rate)
    for kind in extensions[0]["drafted_by_kind"]:  # by kind of draft: a draft model here
        drafted = float(sum(e["drafted_by_kind"][kind] for e in extensions))
        accepted = float(sum(e["accepted_by_kind"][kind] for e in extensions))
        assert got[f"localspec_drafted_tokens_by_kind_total{{kind={kind}}}"] == drafted
        assert got[f"localspec_accepted_tokens_by_kind_total{{kind={kind}}}"] == accepted
        assert kind == "model" or drafted == 0
    assert got["localspec_acceptance_rate_by_kind{kind=model}"] == pytest.approx(rate)
    assert got["localspec_queue_depth"] == 0
    chat_ok = "localspec_http_requests_total{endpoint=/v1/chat/completions,status=200}"
    assert got[chat_ok] == 3
    assert got["localspec_http_requests_total{endpoint=/v1/completions,status=200}"] == 1
    assert got["localspec_http_requests_total{endpoint=/v1/completions,status=400}"] == 1
    assert got["localspec_time_per_output_token_seconds_count"] == 4
    chat_generations = [
        value for key, value in got.items()
        if key.startswith("localspec_generations_total{endpoint=/v1/chat/completions,")
    ]
    assert sum(chat_generations) == 3
