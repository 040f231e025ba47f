"""A hostile localhost (issue 19, items 1 and 4): web pages cannot use the server (Host, Origin,
Content-Type), any text gets a clear 4xx, and a bug answers a generic 500 with a request id that
the log names once, without the prompt. A real server on loopback over a real engine."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from localspec.runtime.engine import Engine
from localspec.server import create_app
from localspec.server.background import BackgroundServer
from localspec.server.options import ServerOptions
from localspec.server.prepare import Prepared

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def engine(tiny_model_path: Path) -> Iterator[Engine]:
    loaded = Engine.load(tiny_model_path, draft="ngram", n_ctx=256, n_threads=1)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def server(engine: Engine) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(engine)) as running:
        yield running


def completion(engine: Engine, **extra: Any) -> dict[str, Any]:
    return {"model": engine.info.target_name, "prompt": "Hello", "max_tokens": 2, **extra}


def rejected(server: BackgroundServer) -> dict[str, float]:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "localspec_rejected_requests_total"
    }


def assert_error(response: httpx.Response, status: int, **fields: Any) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    for key, value in fields.items():
        assert error[key] == value, (key, error)
    return error


# ---- item 1: web pages cannot use it --------------------------------------------------------


def test_dns_rebinding_host_is_refused(server: BackgroundServer, engine: Engine) -> None:
    before = rejected(server)["bad_host"]
    url = f"{server.base_url}/v1/completions"
    rebound = httpx.post(url, json=completion(engine), headers={"Host": f"evil.test:{server.port}"})
    error = assert_error(rebound, 403, code="forbidden_host")
    assert "--allowed-host evil.test" in error["message"]
    models = f"{server.base_url}/v1/models"
    assert httpx.get(models, headers={"Host": "evil.test"}).status_code == 403
    for name in ("localhost", "127.0.0.1", "127.9.8.7", "[::1]", "chat.localhost", "LOCALHOST."):
        host = {"Host": f"{name}:{server.port}"}
        assert httpx.get(models, headers=host).status_code == 200, name
    assert rejected(server)["bad_host"] == before + 2


def test_allowed_host_is_accepted(engine: Engine) -> None:
    app = create_app(engine, ServerOptions(allowed_hosts=("MyBox.lan",)))
    with BackgroundServer(app) as running:
        url = f"{running.base_url}/v1/models"
        assert httpx.get(url, headers={"Host": "mybox.lan:8080"}).status_code == 200
        assert httpx.get(url, headers={"Host": "localhost"}).status_code == 200
        assert httpx.get(url, headers={"Host": "other.lan"}).status_code == 403


def test_cross_site_simple_request_is_refused(server: BackgroundServer, engine: Engine) -> None:
    """A page on another site can POST text/plain without a CORS preflight; it must not run."""
    before = rejected(server)
    url = f"{server.base_url}/v1/completions"
    body = httpx.Request("POST", url, json=completion(engine)).read()
    evil = {"Origin": "https://evil.test", "Content-Type": "text/plain"}
    error = assert_error(httpx.post(url, content=body, headers=evil), 403, code="forbidden_origin")
    assert "--cors-origin https://evil.test" in error["message"]
    plain = httpx.post(url, content=body, headers={"Content-Type": "text/plain"})
    assert_error(plain, 415, code="unsupported_media_type")
    assert_error(httpx.post(url, content=body), 415)  # no Content-Type at all
    same_site = {"Origin": server.base_url, **JSON}
    assert httpx.post(url, content=body, headers=same_site).status_code == 200
    assert httpx.post(url, content=body, headers=JSON).status_code == 200
    after = rejected(server)
    assert after["bad_origin"] == before["bad_origin"] + 1
    assert after["bad_content_type"] == before["bad_content_type"] + 2


def test_named_cors_origin_may_call(engine: Engine) -> None:
    page = "http://localhost:3000"
    with BackgroundServer(create_app(engine, ServerOptions(cors_origins=(page,)))) as running:
        url = f"{running.base_url}/v1/completions"
        response = httpx.post(url, json=completion(engine), headers={"Origin": page})
        assert response.status_code == 200
        assert response.headers["access-control-allow-origin"] == page
        other = httpx.post(url, json=completion(engine), headers={"Origin": "http://evil.test"})
        assert_error(other, 403, code="forbidden_origin")


# ---- item 4: any text in, a clear answer out ------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "M", "messages": [{"role": "user", "content": "hi \\ud800"}]}',
         "messages.0.content"),
        (b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], '
         b'"stop": ["ok", "\\udfff"]}', "stop.1"),
        (b'{"model": "\\ud83d", "messages": [{"role": "user", "content": "hi"}]}', "model"),
        (b'{"model": "M", "messages": [{"role": "user", "content": [{"type": "text", '
         b'"text": "a\\udc00b"}]}]}', "messages.0.content.0.text"),
        (b'{"model": "M", "messages": [{"role": "user", "content": "hi", "\\ud800": 1}]}',
         "messages.0"),
    ],
)
def test_lone_surrogates_are_400_naming_the_field(
    server: BackgroundServer, engine: Engine, body: bytes, param: str
) -> None:
    body = body.replace(b'"M"', f'"{engine.info.target_name}"'.encode())
    url = f"{server.base_url}/v1/chat/completions"
    error = assert_error(httpx.post(url, content=body, headers=JSON), 400, param=param)
    assert "surrogate" in error["message"]


def test_a_surrogate_pair_is_fine(server: BackgroundServer, engine: Engine) -> None:
    body = completion(engine)
    raw = httpx.Request("POST", "/", json=body).read().replace(b'"Hello"', b'"Hi \\ud83d\\ude00"')
    response = httpx.post(f"{server.base_url}/v1/completions", content=raw, headers=JSON)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("depth", [40, 200_000])
def test_deeply_nested_json_is_400(server: BackgroundServer, engine: Engine, depth: int) -> None:
    nested = b"[" * depth + b"]" * depth
    body = b'{"model": "%s", "prompt": "x", "localspec": %s}' % (
        engine.info.target_name.encode(), nested
    )
    response = httpx.post(f"{server.base_url}/v1/completions", content=body, headers=JSON)
    error = assert_error(response, 400, code="invalid_json")
    assert "nests deeper" in error["message"]


SECRET = "my-secret-prompt-4711"


class BrokenPreparer:
    """Fails the way a bug would: an exception whose text holds the prompt and an address."""

    def completion(self, request: Any) -> Prepared:
        raise RuntimeError(f"cannot handle {request.prompt!r} at {object()!r}")


def test_unexpected_error_is_a_generic_500_logged_once(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(engine)
    app.state.localspec.preparer = BrokenPreparer()
    caplog.set_level(logging.INFO)
    with BackgroundServer(app) as running:
        url = f"{running.base_url}/v1/completions"
        response = httpx.post(url, json=completion(engine, prompt=SECRET), timeout=30)
        assert httpx.get(f"{running.base_url}/health").status_code == 200  # still up
    error = assert_error(response, 500, code="internal")
    request_id = response.headers["x-request-id"]
    assert request_id in error["message"]
    assert SECRET not in response.text and "0x" not in response.text
    logged = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(logged) == 1, [r.getMessage() for r in logged]
    text = logged[0].getMessage()
    assert request_id in text and "RuntimeError" in text
    assert SECRET not in text and " at 0x" not in text
    assert logged[0].exc_info is None  # no formatter may add the exception's message back
