"""`localspec serve` as a process (issue 19, items 4 and 6): clean shutdown on SIGTERM/SIGINT,
startup mistakes reported in one line with exit code 2 before a model loads, and command-line
text that is not UTF-8 refused the same way."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.test_server_cli import free_port, wait_healthy

LONG = {"max_tokens": 3000, "ignore_eos": True, "temperature": 0}  # seconds of work
CLI = [sys.executable, "-m", "localspec.cli"]


def start(model: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    command = [*CLI, "serve", "--target", str(model), "--draft", "ngram", "--port", str(port),
               "--threads", "1", "--log-level", "warning", *extra]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, process)
    return process, base


@pytest.fixture
def server(tiny_model_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    # One generation at a time: the second and third requests wait in the queue.
    process, base = start(
        tiny_model_path, "--ctx", "4096", "--shutdown-timeout", "1", "--parallel", "1"
    )
    yield process, base
    if process.poll() is None:
        process.kill()
        process.wait()


def stream_lines(url: str, body: dict[str, object], out: list[str], started: threading.Event,
                 ) -> None:
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line:
                out.append(line)
                started.set()


def wait_depth(base: str, depth: int) -> None:
    deadline = time.monotonic() + 30
    while httpx.get(f"{base}/health").json()["queue_depth"] != depth:
        assert time.monotonic() < deadline, f"the queue never held {depth} requests"
        time.sleep(0.05)


def error_code(line: str) -> str:
    return str(json.loads(line.removeprefix("data: "))["error"]["code"])


def test_sigterm_drains_and_exits_0(
    server: tuple[subprocess.Popen[str], str], tiny_model_path: Path
) -> None:
    process, base = server
    model = httpx.get(f"{base}/v1/models").json()["data"][0]["id"]
    url = f"{base}/v1/completions"
    body = {"model": model, "prompt": "Once upon a time", **LONG}
    running: list[str] = []
    queued: list[str] = []
    whole: list[httpx.Response] = []
    first, second = threading.Event(), threading.Event()
    threads = [
        threading.Thread(target=stream_lines, args=(url, {**body, "stream": True}, running, first)),
        threading.Thread(target=lambda: whole.append(httpx.post(url, json=body, timeout=60))),
        threading.Thread(target=stream_lines, args=(url, {**body, "stream": True}, queued, second)),
    ]
    threads[0].start()
    assert first.wait(30)  # generating
    for thread in threads[1:]:
        thread.start()
    wait_depth(base, 3)
    assert second.wait(30)
    process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(30)
    assert process.wait(timeout=30) == 0
    assert whole[0].status_code == 503
    assert whole[0].json()["error"]["code"] == "server_shutting_down"
    assert queued[0].startswith(":") and queued[-1] == "data: [DONE]"
    assert error_code(queued[-2]) == "server_shutting_down"
    assert len(running) > 2 and running[-1] == "data: [DONE]"
    assert error_code(running[-2]) == "server_shutting_down"  # cut after --shutdown-timeout
    assert "Traceback" not in (process.stderr.read() if process.stderr else "")


def test_sigint_on_an_idle_server_exits_0(tiny_model_path: Path) -> None:
    process, base = start(tiny_model_path, "--ctx", "256")
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 0
    assert "Traceback" not in (process.stderr.read() if process.stderr else "")
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{base}/health", timeout=2)


def one_line_error(command: list[str], stdin: bytes = b"") -> str:
    done = subprocess.run(command, input=stdin, capture_output=True, timeout=120)
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2, err
    assert err.count("\n") == 1 and err.startswith("localspec: error: "), err
    assert "serving" not in err and done.stdout == b""
    return err


def test_startup_mistakes_are_one_line_before_a_model_loads(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    serve = [*CLI, "serve", "--target", str(tiny_model_path), "--threads", "1"]
    assert "--host" in one_line_error([*serve, "--host", "no such host"])
    assert "not one of this machine's" in one_line_error([*serve, "--host", "192.0.2.1"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert "in use" in one_line_error([*serve, "--port", str(port)])
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a model at all")
    assert "GGUF" in one_line_error([*CLI, "serve", "--target", str(broken), "--port", "0"])
    assert "--max-connections" in one_line_error([*serve, "--max-connections", "2"])


def test_text_that_is_not_utf8_exits_2_before_a_model_loads(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.gguf")  # reached only if the text check came later
    undecodable = b"caf\xe9".decode("utf-8", "surrogateescape")  # as Python holds such bytes
    error = one_line_error([*CLI, "run", undecodable, "--target", missing])
    assert "b'caf\\xe9'" in error and "UTF-8" in error
    error = one_line_error([*CLI, "run", "-", "--target", missing], stdin=b"hello \xff\xfe")
    assert "Standard input is not valid UTF-8" in error
