"""Slow, idle, many and heavy clients (issue 19, items 3 and 5): header, body and keep-alive
timeouts, the connection cap, and /health staying fast while huge prompts are refused. Raw
sockets where a client must misbehave; a real server over a real engine."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from localspec.runtime.engine import Engine
from localspec.server import create_app
from localspec.server.background import BackgroundServer
from localspec.server.options import ServerOptions

QUICK = ServerOptions(header_timeout=0.5, body_timeout=0.5, keep_alive_timeout=1)
WAIT = 10.0  # generous: these are upper bounds for a close that should come within a second


@pytest.fixture(scope="module")
def engine(tiny_model_path: Path) -> Iterator[Engine]:
    loaded = Engine.load(tiny_model_path, draft="ngram", n_ctx=256, n_threads=1)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def quick(engine: Engine) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(engine, QUICK)) as running:
        yield running


def connect(server: BackgroundServer) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=WAIT)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (socket.timeout if it never does)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def read_response(sock: socket.socket) -> bytes:
    """One whole response with a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


HEALTH = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def test_slow_headers_are_cut_off(quick: BackgroundServer) -> None:
    with connect(quick) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
        assert read_until_closed(sock).startswith(b"HTTP/1.1 408 ")


def test_slow_headers_on_a_kept_alive_connection_are_cut_off(quick: BackgroundServer) -> None:
    with connect(quick) as sock:
        sock.sendall(HEALTH)
        assert b'"status":"ok"' in read_response(sock)
        sock.sendall(b"GET /health HTTP/1.1\r\n")  # keeps the idle timer off, never ends
        assert read_until_closed(sock).startswith(b"HTTP/1.1 408 ")


def test_slow_body_is_408(quick: BackgroundServer, engine: Engine) -> None:
    body = json.dumps({"model": engine.info.target_name, "prompt": "Hi"}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with connect(quick) as sock:
        sock.sendall(head + body[:5])  # the rest never comes
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b'"code":"request_timeout"' in answer


def test_a_client_leaving_mid_body_is_not_an_error(
    quick: BackgroundServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\"")
    with connect(quick) as sock:
        sock.sendall(head)
    time.sleep(0.3)  # give the server time to notice; nothing may be logged
    assert httpx.get(f"{quick.base_url}/health").status_code == 200
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_idle_keep_alive_connection_is_closed(quick: BackgroundServer) -> None:
    with connect(quick) as sock:
        sock.sendall(HEALTH)
        assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        assert read_until_closed(sock) == b""  # closed after keep_alive_timeout, not WAIT


def test_open_connections_are_capped(engine: Engine) -> None:
    options = ServerOptions(max_queue=1, max_connections=3, keep_alive_timeout=60)
    with BackgroundServer(create_app(engine, options)) as server:
        idle = [connect(server) for _ in range(3)]
        try:
            for sock in idle:  # a served request: the server has surely accepted the socket
                sock.sendall(HEALTH)
                assert read_response(sock).startswith(b"HTTP/1.1 200 ")
            refused = httpx.get(f"{server.base_url}/health", timeout=WAIT)
            assert refused.status_code == 503
            idle.pop().close()
            deadline = time.monotonic() + WAIT
            while httpx.get(f"{server.base_url}/health").status_code != 200:
                assert time.monotonic() < deadline, "a closed connection kept its place"
                time.sleep(0.05)
        finally:
            for sock in idle:
                sock.close()


@pytest.fixture(scope="module")
def long_context_engine(tiny_model_path: Path) -> Iterator[Engine]:
    loaded = Engine.load(tiny_model_path, draft="none", n_ctx=16384, n_threads=1)
    yield loaded
    loaded.close()


def chat_bytes(engine: Engine, text: str) -> bytes:
    messages = [{"role": "user", "content": text}]
    return json.dumps({"model": engine.info.target_name, "messages": messages}).encode()


def health_latencies_while(server: BackgroundServer, posts: list[bytes],
                           path: str) -> tuple[list[float], list[httpx.Response]]:
    """/health's answer times while ``posts`` are sent at once, and their answers."""
    headers = {"Content-Type": "application/json"}
    with ThreadPoolExecutor(len(posts)) as pool:
        httpx.get(f"{server.base_url}/health")  # a warm connection path
        futures = [pool.submit(httpx.post, f"{server.base_url}{path}", content=b,
                               headers=headers, timeout=120) for b in posts]
        latencies = []
        with httpx.Client(base_url=server.base_url) as client:
            while not all(future.done() for future in futures):
                start = time.perf_counter()
                assert client.get("/health").status_code == 200
                latencies.append(time.perf_counter() - start)
                time.sleep(0.01)
        return latencies, [f.result() for f in futures]


def test_health_stays_fast_while_huge_prompts_are_refused(long_context_engine: Engine) -> None:
    """Eight ~4 MB prompts, half of them small enough to be tokenized (about a second each)
    before they are refused: /health must answer promptly throughout (issue: ~100 ms)."""
    engine = long_context_engine
    bodies = [chat_bytes(engine, ("word " if i % 2 else "wordy ") * (800_000 if i % 2 else 130_000))
              for i in range(8)]
    with BackgroundServer(create_app(engine)) as server:
        latencies, answers = health_latencies_while(server, bodies, "/v1/chat/completions")
    for answer in answers:
        assert answer.status_code == 400, answer.text[:200]
        assert answer.json()["error"]["code"] == "context_length_exceeded"
    by_bytes = [a for a in answers if "bytes" in a.json()["error"]["message"]]
    assert len(by_bytes) == 4  # the 4 MB ones were refused without tokenizing
    assert len(latencies) >= 5
    # Generous bounds on a shared 2-core machine; a blocked loop stalls for a second or more.
    assert sorted(latencies)[len(latencies) // 2] < 0.1, sorted(latencies)
    assert max(latencies) < 0.5, sorted(latencies)[-5:]


def test_health_stays_fast_while_bodies_of_unknown_keys_are_parsed(engine: Engine) -> None:
    """Eight 2.6 MB bodies of 200,000 unknown keys kept /health waiting 12 s: the first unknown
    key is a 400 before the body is walked, and at most two bodies are prepared at once."""
    keys = {f"k{i:06d}": 1 for i in range(200_000)}
    body = json.dumps({"model": engine.info.target_name, "prompt": "hi", **keys}).encode()
    assert len(body) > 2_500_000
    with BackgroundServer(create_app(engine)) as server:
        latencies, answers = health_latencies_while(server, [body] * 8, "/v1/completions")
    for answer in answers:
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["code"] == "unknown_parameter" and error["param"] == "k000000"
    assert latencies  # /health was asked while the bodies were being sent and read
    assert sorted(latencies)[len(latencies) // 2] < 0.1, sorted(latencies)
    assert max(latencies) < 0.5, sorted(latencies)[-5:]


def test_a_conversation_longer_than_the_context_is_refused_before_rendering(
        engine: Engine) -> None:
    """20,000 short turns: more messages than the context has tokens, refused at once (the
    template would render all of them first)."""
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi"}
                for i in range(20_000)]
    body = {"model": engine.info.target_name, "messages": messages}
    with BackgroundServer(create_app(engine)) as server:
        started = time.perf_counter()
        answer = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
        took = time.perf_counter() - started
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "20000 messages" in error["message"]
    assert took < 5.0  # the JSON itself; rendering 20,000 turns took far longer
