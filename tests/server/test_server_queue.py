"""The server's queue (issue 19, items 2, 5 and 7): places belong to live clients, a queued
stream opens at once, per-request limits (--max-tokens, --request-timeout), and the queue's
metrics. A real server on loopback over a real engine; the engine is held busy with a job on its
own thread where a test needs requests to wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from localspec.runtime.engine import Engine
from localspec.server import create_app
from localspec.server.background import BackgroundServer
from localspec.server.options import ServerOptions
from localspec.types import GenerationParams

LONG = {"max_tokens": 3000, "ignore_eos": True, "temperature": 0}  # seconds of work


@pytest.fixture(scope="module")
def engine(tiny_model_path: Path) -> Iterator[Engine]:
    loaded = Engine.load(tiny_model_path, draft="ngram", n_ctx=4096, n_threads=1)
    yield loaded
    loaded.close()


@contextmanager
def engine_held(engine: Engine) -> Iterator[None]:
    """Keep the engine thread busy (as a long generation would) until the block ends."""
    gate = threading.Event()
    holder = threading.Thread(target=engine._call, args=(gate.wait,), daemon=True)
    holder.start()
    try:
        yield
    finally:
        gate.set()
        holder.join(10)


def body(engine: Engine, **extra: Any) -> dict[str, Any]:
    return {"model": engine.info.target_name, "prompt": "Once upon a time", "max_tokens": 4,
            **extra}


def url(server: BackgroundServer, path: str = "/v1/completions") -> str:
    return f"{server.base_url}{path}"


def metrics(server: BackgroundServer) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url(server, "/metrics")).text):
        for sample in family.samples:
            label = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{label}}}" if label else sample.name] = sample.value
    return out


def metrics_once(server: BackgroundServer, name: str, timeout: float = 10.0) -> dict[str, float]:
    """The metrics once ``name`` is among them (or as they are at the deadline)."""
    deadline = time.monotonic() + timeout
    counts = metrics(server)
    while name not in counts and time.monotonic() < deadline:
        time.sleep(0.02)
        counts = metrics(server)
    return counts


def wait_depth(server: BackgroundServer, depth: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(url(server, "/health")).json()["queue_depth"] == depth:
            return
        time.sleep(0.02)
    raise AssertionError(f"the queue depth did not become {depth}")


def test_queued_stream_opens_at_once_and_a_leaving_client_frees_its_place(
    engine: Engine,
) -> None:
    app = create_app(engine, ServerOptions(max_queue=2))
    with BackgroundServer(app) as server, ThreadPoolExecutor(1) as pool:
        with engine_held(engine):
            running: Future[httpx.Response] = pool.submit(
                httpx.post, url(server), json=body(engine), timeout=60
            )
            wait_depth(server, 1)
            queued = {"json": body(engine, stream=True), "timeout": 10}
            with httpx.stream("POST", url(server), **queued) as waiting:  # type: ignore[arg-type]
                assert waiting.status_code == 200
                assert waiting.headers["content-type"].startswith("text/event-stream")
                lines = waiting.iter_lines()  # held: a dropped iterator closes the response
                assert next(lines).startswith(":")  # a comment at once: the stream is alive
                full = httpx.post(url(server), json=body(engine), timeout=10)
                assert full.status_code == 429
            wait_depth(server, 1)  # the leaving client's place is free before the engine is
            with httpx.stream("POST", url(server), **queued) as again:  # type: ignore[arg-type]
                assert again.status_code == 200
            wait_depth(server, 1)
        assert running.result().status_code == 200
        # The generation is counted as its response ends, which the client may see first.
        finished = "localspec_generations_total{endpoint=/v1/completions,finish_reason=length}"
        counts = metrics_once(server, finished)
    assert counts["localspec_rejected_requests_total{reason=queue_full}"] == 1
    assert counts["localspec_queue_wait_seconds_count"] == 1  # only the first request ran
    assert counts["localspec_generations_total{endpoint=/v1/completions,finish_reason=length}"] == 1


def test_waiting_whole_request_frees_its_place_when_the_client_leaves(engine: Engine) -> None:
    app = create_app(engine, ServerOptions(max_queue=2))
    with BackgroundServer(app) as server, ThreadPoolExecutor(1) as pool:
        with engine_held(engine):
            running = pool.submit(httpx.post, url(server), json=body(engine), timeout=60)
            wait_depth(server, 1)
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url(server), json=body(engine), timeout=1.0)
            wait_depth(server, 1)
            with pytest.raises(httpx.ReadTimeout):  # admitted, not 429: it waits
                httpx.post(url(server), json=body(engine), timeout=1.0)
        assert running.result().status_code == 200
        wait_depth(server, 0)


def test_queued_stream_ends_with_an_error_when_its_deadline_passes(engine: Engine) -> None:
    app = create_app(engine, ServerOptions(max_queue=3, request_timeout=1.0))
    with BackgroundServer(app) as server, ThreadPoolExecutor(1) as pool:
        with engine_held(engine):
            running = pool.submit(httpx.post, url(server), json=body(engine), timeout=60)
            wait_depth(server, 1)
            whole = httpx.post(url(server), json=body(engine), timeout=30)
            with httpx.stream("POST", url(server), json=body(engine, stream=True)) as stream:
                lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
        assert running.result().status_code == 200
        counts = metrics(server)
    assert whole.status_code == 503 and whole.json()["error"]["code"] == "queue_timeout"
    assert '"queue_timeout"' in lines[0] and lines[-1] == "data: [DONE]"
    assert counts["localspec_rejected_requests_total{reason=queue_timeout}"] == 2


def test_deadline_ends_a_running_generation_as_length(engine: Engine) -> None:
    # A deadline at a quarter of the whole answer's time: a GPU writes LONG in well under a
    # second, this CPU takes seconds.
    started = time.perf_counter()
    whole = GenerationParams(max_tokens=LONG["max_tokens"], ignore_eos=True, temperature=0.0)
    engine.generate("Once upon a time", whole)
    app = create_app(engine, ServerOptions(request_timeout=(time.perf_counter() - started) / 4))
    with BackgroundServer(app) as server:
        response = httpx.post(url(server), json=body(engine, **LONG), timeout=60)
        streamed = httpx.post(url(server), json=body(engine, stream=True, **LONG), timeout=60)
    assert response.status_code == 200
    choice, usage = response.json()["choices"][0], response.json()["usage"]
    assert choice["finish_reason"] == "length"
    assert 0 < usage["completion_tokens"] < LONG["max_tokens"]
    events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and '"finish_reason": "length"' in events[-2]


def test_max_tokens_is_the_default_and_the_cap(engine: Engine) -> None:
    app = create_app(engine, ServerOptions(max_tokens=5))
    with BackgroundServer(app) as server:
        asked = httpx.post(url(server), json=body(engine, max_tokens=50, ignore_eos=True))
        unset = {"model": engine.info.target_name, "prompt": "Hi", "ignore_eos": True}
        default = httpx.post(url(server), json=unset)
    for response in (asked, default):
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 5
        assert response.json()["choices"][0]["finish_reason"] == "length"
