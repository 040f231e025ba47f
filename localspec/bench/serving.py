"""`localspec bench --clients 1,2,4,8`: batched serving measured as clients see it.

The same prompts go to two real servers (``localspec serve`` in child processes): one with
``--parallel 1`` (one generation at a time) and one with ``--parallel N``. Both are started
(one after the other, each calibrating alone) and stay up; the rounds then take turns between
them, the order swapped on every repeat, so that the machine's drift hits both alike (an idle
server waits without computing; its model does take memory). For each number of concurrent
streaming clients, every client sends one prompt; the round's aggregate tokens per second
(all generated tokens over the round's wall time) and each client's time to first token
(first streamed text) are recorded. Each round runs ``repeat`` times, taking turns with the
other client counts; the table gives the median aggregate rate and the median time to first
token over all of them.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx

from localspec.bench.prompts import Prompt
from localspec.errors import InvalidParameterError
from localspec.types import GenerationParams

READY_SECONDS = 300.0


@dataclass(frozen=True)
class Round:
    """One round: ``clients`` concurrent requests against a server with ``parallel`` slots."""

    parallel: int
    clients: int
    tokens: int
    seconds: float
    ttft: list[float]

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Summary:
    """The repeats of one round: the median aggregate rate, and the median time to first
    token over every client of every repeat."""

    tokens_per_second: float
    median_ttft: float

    @classmethod
    def of(cls, rounds: list[Round]) -> Summary:
        return cls(statistics.median(r.tokens_per_second for r in rounds),
                   statistics.median(t for r in rounds for t in r.ttft))


def parse_clients(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise InvalidParameterError(
            f"--clients {text!r} is invalid: give client counts such as 1,2,4,8.")
    return counts


def run_serving(model_args: list[str], prompts: list[Prompt], params: GenerationParams,
                clients: list[int], parallel: int, repeat: int = 1) -> list[Round]:
    """Every client count against --parallel 1 and --parallel ``parallel``, taking turns."""
    if len(prompts) < max(clients):
        raise InvalidParameterError(
            f"{max(clients)} clients need as many prompts; the prompt set has {len(prompts)}.")
    rounds: list[Round] = []
    with ExitStack() as stack:
        urls = {}
        for slots in (1, parallel):
            urls[slots] = stack.enter_context(_Server(model_args, slots))
            with httpx.Client(timeout=600) as client:  # warm-up: start-up calibration, caches
                _request(client, urls[slots], prompts[0], params)
        for r in range(repeat):
            for count in clients:
                for slots in ((1, parallel) if r % 2 == 0 else (parallel, 1)):
                    rounds.append(_round(urls[slots], slots, prompts[:count], params))
    return rounds


def _round(url: str, parallel: int, prompts: list[Prompt], params: GenerationParams) -> Round:
    # One client for the round, made before the clock starts: making an httpx client (its SSL
    # context) takes ~20 ms of this process's CPU, which is no part of the server's answer.
    limits = httpx.Limits(max_connections=len(prompts), max_keepalive_connections=len(prompts))
    with httpx.Client(timeout=600, limits=limits) as client:
        start = time.perf_counter()
        with ThreadPoolExecutor(len(prompts)) as pool:
            outcomes = list(pool.map(lambda p: _request(client, url, p, params, start), prompts))
        seconds = time.perf_counter() - start
    return Round(parallel, len(prompts), sum(n for n, _ in outcomes), seconds,
                 [t for _, t in outcomes])


def _request(client: httpx.Client, url: str, prompt: Prompt, params: GenerationParams,
             start: float | None = None) -> tuple[int, float]:
    """(generated tokens, seconds from ``start`` to the first streamed text)."""
    began = time.perf_counter() if start is None else start
    body: dict[str, Any] = {
        "model": "bench", "prompt": prompt.text, "max_tokens": params.max_tokens,
        "temperature": params.temperature, "seed": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
        # Every round reads its prompts: a server with more slots would otherwise still hold
        # them from the round before, and its time to first token would measure its cache.
        "cache_prompt": False,
    }
    first, tokens = 0.0, 0
    with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            if not first and any(c.get("text") for c in event.get("choices", [])):
                first = time.perf_counter() - began
    return tokens, first


class _Server:
    """``localspec serve --parallel N`` on a free loopback port, for one ``with`` block."""

    def __init__(self, model_args: list[str], parallel: int) -> None:
        self._args = model_args
        self._parallel = parallel
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> str:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self._process = subprocess.Popen(
            [sys.executable, "-m", "localspec.cli", "serve", *self._args, "--model-name", "bench",
             "--port", str(port), "--parallel", str(self._parallel), "--log-level", "warning",
             "--max-queue", "64", "--max-connections", "128"],
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline and self._process.poll() is None:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                time.sleep(0.2)
        self.__exit__()
        raise InvalidParameterError("the bench server did not start; run `localspec serve` with "
                                    "the same model flags to see why.")

    def __exit__(self, *exc: object) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(60)


def rounds_table(rounds: list[Round], parallel: int) -> list[dict[str, float]]:
    """One row per client count: both servers' figures and their ratios."""
    rows = []
    for count in dict.fromkeys(r.clients for r in rounds):
        one = Summary.of([r for r in rounds if r.parallel == 1 and r.clients == count])
        many = Summary.of([r for r in rounds if r.parallel == parallel and r.clients == count])
        rows.append({
            "clients": count,
            "tokens_per_second_parallel_1": one.tokens_per_second,
            f"tokens_per_second_parallel_{parallel}": many.tokens_per_second,
            "throughput_ratio": many.tokens_per_second / max(one.tokens_per_second, 1e-9),
            "median_ttft_parallel_1": one.median_ttft,
            f"median_ttft_parallel_{parallel}": many.median_ttft,
            "ttft_ratio": many.median_ttft / max(one.median_ttft, 1e-9),
        })
    return rows
