"""A worker killed in the middle of a generation served by a real `localspec serve` (issue 22):
the stream ends with a clear error naming the worker, the server keeps answering /health and
says what happened, requests get HTTP 503 with one sentence while the worker is away, and once
a worker answers on the same port again the next request loads the model again and gets the
same output as before the failure."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx

from tests.fixtures.rpc_workers import start_worker, workers
from tests.server.test_server_process import LONG, start, stream_lines

GREEDY = {"prompt": "the cat sat on the mat.", "max_tokens": 24, "temperature": 0,
          "ignore_eos": True}


def kill_mid_stream(base: str, model: str, victim: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """Stream a long generation, kill ``victim`` once it streams; the events."""
    lines: list[str] = []
    streaming = threading.Event()
    body = {"model": model, "prompt": "the cat sat on the mat.", "stream": True, **LONG}
    reader = threading.Thread(target=stream_lines,
                              args=(f"{base}/v1/completions", body, lines, streaming))
    reader.start()
    assert streaming.wait(60), "the stream never started"
    victim.kill()
    victim.wait()
    reader.join(60)
    assert not reader.is_alive(), "the stream did not end after the worker died"
    return [json.loads(line.removeprefix("data: ")) for line in lines
            if line.startswith("data: {")]


def test_a_worker_killed_mid_generation_is_an_error_then_the_server_recovers(
    tiny_model_path: Path,
) -> None:
    with workers(2) as started:
        endpoints = [endpoint for _, endpoint in started]
        process, base = start(tiny_model_path, "--rpc", ",".join(endpoints), "--ctx", "4096",
                              "--parallel", "1")
        try:
            model = httpx.get(f"{base}/v1/models").json()["data"][0]["id"]
            before = httpx.post(f"{base}/v1/completions", timeout=60,
                                json={"model": model, **GREEDY})
            assert before.status_code == 200
            victim, killed = started[0]
            events = kill_mid_stream(base, model, victim)
            error = events[-1]["error"]["message"]
            print(error)
            assert f"RPC worker at {killed}" in error and "rpc-worker" in error
            assert sum(len(e["choices"][0]["text"]) for e in events[:-1] if "choices" in e) > 0

            health = httpx.get(f"{base}/health", timeout=10)
            assert health.status_code == 200 and health.json()["status"] == "worker_lost"
            assert killed in health.json()["error"]
            later = httpx.post(f"{base}/v1/completions", timeout=60,
                               json={"model": model, "prompt": "hello", "max_tokens": 4})
            assert later.status_code == 503
            print(later.json()["error"]["message"])
            assert f"RPC worker at {killed}" in later.json()["error"]["message"]
            assert httpx.get(f"{base}/health", timeout=10).json()["status"] == "worker_lost"

            started[0] = start_worker(int(killed.rsplit(":", 1)[1]))  # back on the same port
            after = httpx.post(f"{base}/v1/completions", timeout=120,
                               json={"model": model, **GREEDY})
            assert after.status_code == 200, after.text
            assert after.json()["choices"][0]["text"] == before.json()["choices"][0]["text"]
            assert httpx.get(f"{base}/health", timeout=10).json()["status"] == "ok"
            assert process.poll() is None  # still serving
        finally:
            process.kill()
            process.wait()
