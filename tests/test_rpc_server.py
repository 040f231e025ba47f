"""A worker killed in the middle of a generation served by a real `localspec serve` (issue 22):
the stream ends with a clear error naming the worker, the server keeps answering /health, and
later requests get HTTP 503 with the same sentence instead of a crash."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx

from tests.rpc_workers import workers
from tests.test_server_process import LONG, start, stream_lines


def test_a_worker_killed_mid_generation_is_an_error_and_the_server_stays_up(
    tiny_model_path: Path,
) -> None:
    with workers(2) as started:
        endpoints = [endpoint for _, endpoint in started]
        process, base = start(tiny_model_path, "--rpc", ",".join(endpoints), "--ctx", "4096",
                              "--parallel", "1")
        try:
            lines: list[str] = []
            streaming = threading.Event()
            model = httpx.get(f"{base}/v1/models").json()["data"][0]["id"]
            body = {"model": model, "prompt": "the cat sat on the mat.", "stream": True, **LONG}
            reader = threading.Thread(target=stream_lines,
                                      args=(f"{base}/v1/completions", body, lines, streaming))
            reader.start()
            assert streaming.wait(60), "the stream never started"
            victim, killed = started[0]
            victim.kill()
            victim.wait()
            reader.join(60)
            assert not reader.is_alive(), "the stream did not end after the worker died"

            events = [json.loads(line.removeprefix("data: ")) for line in lines
                      if line.startswith("data: {")]
            error = events[-1]["error"]["message"]
            print(error)
            assert f"RPC worker at {killed}" in error and "rpc-worker" in error
            assert sum(len(e["choices"][0]["text"]) for e in events[:-1] if "choices" in e) > 0

            assert httpx.get(f"{base}/health", timeout=10).status_code == 200
            later = httpx.post(f"{base}/v1/completions", timeout=60,
                               json={"model": model, "prompt": "hello", "max_tokens": 4})
            assert later.status_code == 503
            assert f"RPC worker at {killed}" in later.json()["error"]["message"]
            assert process.poll() is None  # still serving
        finally:
            process.kill()
            process.wait()
