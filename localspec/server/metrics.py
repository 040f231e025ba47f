"""Prometheus metrics of one server app, in a per-app ``CollectorRegistry``.

Names (all prefixed ``localspec_``):
- ``http_requests_total{endpoint,status}``: answered HTTP requests (streams count when they start).
- ``generations_total{endpoint,finish_reason}``: finished generations (``cancelled`` included).
- ``prompt_tokens_total``, ``generated_tokens_total``: tokens in and out.
- ``drafted_tokens_total``, ``accepted_tokens_total``, ``rejected_tokens_total``.
- ``drafted_tokens_by_kind_total{kind}``, ``accepted_tokens_by_kind_total{kind}`` and
  ``acceptance_rate_by_kind{kind}``: the same by who drafted (``ngram``, ``model``, ``eagle3``,
  ...: the core's draft sources; a hybrid drafter fills two).
- ``target_passes_total``: target verification passes during generation; every pass counts, the
  one that yields a generation's end-of-generation token (not emitted) included, so a plain
  answer that ends itself has one pass more than generated tokens.
- ``acceptance_rate``: accepted / drafted over the server's lifetime.
- ``mean_accepted_length``: tau over the server's lifetime, (accepted + target passes) / target
  passes (``types.mean_accepted_length``: tokens each pass yields, 1.0 for plain decoding).
- ``time_per_output_token_seconds``: histogram, one observation per generation
  (generation seconds / generated tokens; prefill excluded).
- ``time_to_first_token_seconds``: histogram, one observation per generation.
- ``queue_depth``: requests running or waiting in the server's queue.
- ``queue_wait_seconds``: histogram, time from arrival to a running slot, per started request.
- ``rejected_requests_total{reason}``: requests refused before they ran, by ``REJECT_REASONS``.
- ``batch_size``: histogram, generations in each target pass (batched serving, ``--parallel``).
- ``pass_rows``: histogram, rows of each target pass (every generation's [last, drafts]).
- ``request_tokens_per_second``: histogram, one observation per generation.
- ``tokens_per_second``: tokens emitted by all generations over the last 10 seconds, per second.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST as PROMETHEUS_CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from localspec.runtime.engine_loop import PassReport
from localspec.types import GenerationStats, mean_accepted_length

__all__ = ["PROMETHEUS_CONTENT_TYPE", "ServerMetrics"]

TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
RATE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
RATE_WINDOW_SECONDS = 10.0
WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

# Why a request was refused (a bounded label set; docs/server.md explains each).
REJECT_REASONS = (
    "queue_full",  # 429: --max-queue requests running or waiting
    "queue_timeout",  # 503: its --request-timeout passed while it waited
    "shutting_down",  # 503: the server is stopping
    "too_large",  # 413: body over --max-request-bytes, or a prompt that cannot fit
    "slow_body",  # 408: the body did not arrive within the body timeout
    "bad_host",  # 403: a Host header that is not loopback or --allowed-host
    "bad_origin",  # 403: a browser Origin not named with --cors-origin
    "bad_content_type",  # 415: a body that is not declared as JSON
    "bad_api_key",  # 401
)


class ServerMetrics:
    """All counters of one app. Thread-safe: generations and passes are recorded on the
    engine thread."""

    def __init__(self, queue_depth: Callable[[], int]) -> None:
        self._totals = _Totals()
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.http_requests = Counter(
            "localspec_http_requests", "Answered HTTP requests.", ["endpoint", "status"],
            registry=reg,
        )
        self.generations = Counter(
            "localspec_generations", "Finished generations.", ["endpoint", "finish_reason"],
            registry=reg,
        )
        self.prompt_tokens = Counter(
            "localspec_prompt_tokens", "Prompt tokens processed.", registry=reg
        )
        self.generated_tokens = Counter(
            "localspec_generated_tokens", "Tokens generated.", registry=reg
        )
        self.drafted = Counter("localspec_drafted_tokens", "Tokens drafted.", registry=reg)
        self.accepted = Counter(
            "localspec_accepted_tokens", "Drafted tokens accepted by the target.", registry=reg
        )
        self.rejected = Counter(
            "localspec_rejected_tokens", "Drafted tokens rejected by the target.", registry=reg
        )
        self.drafted_by_kind = Counter(
            "localspec_drafted_tokens_by_kind", "Tokens drafted, by kind of draft.", ["kind"],
            registry=reg,
        )
        self.accepted_by_kind = Counter(
            "localspec_accepted_tokens_by_kind", "Drafted tokens accepted, by kind of draft.",
            ["kind"], registry=reg,
        )
        self.acceptance_by_kind = Gauge(
            "localspec_acceptance_rate_by_kind", "Accepted / drafted tokens since start, by kind.",
            ["kind"], registry=reg,
        )
        self.target_passes = Counter(
            "localspec_target_passes", "Target verification passes.", registry=reg
        )
        self.time_per_token = Histogram(
            "localspec_time_per_output_token_seconds",
            "Generation time per generated token, one observation per generation.",
            buckets=TPOT_BUCKETS, registry=reg,
        )
        self.time_to_first_token = Histogram(
            "localspec_time_to_first_token_seconds",
            "Time to first token (prefill included), one observation per generation.",
            buckets=TTFT_BUCKETS, registry=reg,
        )
        self.queue_wait = Histogram(
            "localspec_queue_wait_seconds",
            "Seconds from a request's arrival to its running slot.",
            buckets=WAIT_BUCKETS, registry=reg,
        )
        self.refused = Counter(
            "localspec_rejected_requests", "Requests refused before they ran, by reason.",
            ["reason"], registry=reg,
        )
        for reason in REJECT_REASONS:
            self.refused.labels(reason=reason)
        self.batch_size = Histogram(
            "localspec_batch_size", "Generations in each target pass.", buckets=BATCH_BUCKETS,
            registry=reg,
        )
        self.pass_rows = Histogram(
            "localspec_pass_rows", "Rows of each target pass.", buckets=ROWS_BUCKETS,
            registry=reg,
        )
        self.request_rate = Histogram(
            "localspec_request_tokens_per_second",
            "Generated tokens per second of generation, one observation per generation.",
            buckets=RATE_BUCKETS, registry=reg,
        )
        self._recent = _RecentTokens(RATE_WINDOW_SECONDS)
        self._gauge(
            "localspec_tokens_per_second",
            f"Tokens emitted by all generations in the last {RATE_WINDOW_SECONDS:g} s, per second.",
            self._recent.rate,
        )
        self._gauge("localspec_queue_depth", "Requests waiting or running.", queue_depth)
        self._gauge(
            "localspec_acceptance_rate", "Accepted / drafted tokens since start.",
            lambda: self._totals.ratio("accepted", "drafted"),
        )
        self._gauge(
            "localspec_mean_accepted_length",
            "Tokens yielded per target pass since start, (accepted + passes) / passes.",
            self._totals.tau,
        )

    def _gauge(self, name: str, doc: str, read: Callable[[], float]) -> None:
        Gauge(name, doc, registry=self.registry).set_function(read)

    def record_request(self, endpoint: str, status: int) -> None:
        self.http_requests.labels(endpoint=endpoint, status=str(status)).inc()

    def record_rejected(self, reason: str) -> None:
        assert reason in REJECT_REASONS, reason
        self.refused.labels(reason=reason).inc()

    def record_queue_wait(self, seconds: float) -> None:
        self.queue_wait.observe(seconds)

    def record_pass(self, report: PassReport) -> None:
        """One target pass (called on the engine thread)."""
        self.batch_size.observe(report.sequences)
        self.pass_rows.observe(report.rows)
        self._recent.add(report.emitted)

    def record_generation(self, endpoint: str, finish_reason: str, stats: GenerationStats) -> None:
        self.generations.labels(endpoint=endpoint, finish_reason=finish_reason).inc()
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.generated_tokens.inc(stats.n_tokens)
        self.drafted.inc(stats.drafted)
        self.accepted.inc(stats.accepted)
        self.rejected.inc(stats.rejected)
        self.target_passes.inc(stats.target_passes)
        self._totals.add(stats)
        for kind, drafted in stats.drafted_by_kind.items():
            self.drafted_by_kind.labels(kind=kind).inc(drafted)
            self.accepted_by_kind.labels(kind=kind).inc(stats.accepted_by_kind.get(kind, 0))
            self.acceptance_by_kind.labels(kind=kind).set(self._totals.kind_rate(kind))
        if stats.n_tokens > 0:
            self.time_per_token.observe(stats.generation_seconds / stats.n_tokens)
            self.time_to_first_token.observe(stats.time_to_first_token)
        if stats.generation_seconds > 0:
            self.request_rate.observe(stats.n_tokens / stats.generation_seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclass
class _Totals:
    """Lifetime sums behind the ratio gauges (prometheus counters have no public read)."""

    drafted: int = 0
    accepted: int = 0
    passes: int = 0
    drafted_by_kind: dict[str, int] = field(default_factory=dict)
    accepted_by_kind: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, stats: GenerationStats) -> None:
        with self.lock:
            for kind, n in stats.drafted_by_kind.items():
                self.drafted_by_kind[kind] = self.drafted_by_kind.get(kind, 0) + n
                self.accepted_by_kind[kind] = (
                    self.accepted_by_kind.get(kind, 0) + stats.accepted_by_kind.get(kind, 0)
                )
            self.drafted += stats.drafted
            self.accepted += stats.accepted
            self.passes += stats.target_passes

    def kind_rate(self, kind: str) -> float:
        with self.lock:
            drafted = self.drafted_by_kind.get(kind, 0)
            return self.accepted_by_kind.get(kind, 0) / drafted if drafted else 0.0

    def tau(self) -> float:
        with self.lock:
            return mean_accepted_length(self.accepted, self.passes)

    def ratio(self, numerator: str, denominator: str) -> float:
        with self.lock:
            bottom = getattr(self, denominator)
            return getattr(self, numerator) / bottom if bottom else 0.0


class _RecentTokens:
    """Tokens emitted in the last ``window`` seconds (the aggregate rate gauge)."""

    def __init__(self, window: float) -> None:
        self._window = window
        self._events: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def add(self, tokens: int) -> None:
        with self._lock:
            self._events.append((time.monotonic(), tokens))
            self._trim()

    def rate(self) -> float:
        with self._lock:
            self._trim()
            return sum(n for _, n in self._events) / self._window

    def _trim(self) -> None:
        cutoff = time.monotonic() - self._window
        while self._events and self._events[0][0] < cutoff:
            self._events.popleft()
