"""Unit tests of single server layers: schemas, error mapping, metrics text (no engine)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from localspec.errors import InvalidParameterError, PromptTooLongError, QueueFullError
from localspec.server import errors
from localspec.server.guard import host_name, is_loopback
from localspec.server.metrics import REJECT_REASONS, ServerMetrics
from localspec.server.options import ServerOptions
from localspec.server.request_queue import QueueTimeout, RequestQueue
from localspec.server.responses import Shape
from localspec.server.schemas import ChatCompletionRequest, CompletionRequest
from localspec.types import GenerationStats

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def body_of(response: Any) -> dict[str, Any]:
    return json.loads(bytes(response.body))


def validation_body(data: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate(data)
    response = errors.from_validation_error(caught.value)
    assert response.status_code == 400
    return body_of(response)["error"]


def test_missing_field_names_the_parameter() -> None:
    error = validation_body({"model": "m"})
    assert error["param"] == "messages"
    assert error["code"] == "missing_required_parameter"
    assert error["type"] == "invalid_request_error"


def test_unknown_field_is_rejected_not_ignored() -> None:
    error = validation_body({**CHAT, "audio": {"voice": "alloy"}})
    assert error["param"] == "audio"
    assert "audio" in error["message"]


def test_wrong_type_is_rejected() -> None:
    error = validation_body({**CHAT, "temperature": "hot"})
    assert error["param"] == "temperature"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"grammar": "root ::= x", "response_format": {"type": "json_object"}}, "grammar"),
        ({"logit_bias": {"1": 2.0}}, "logit_bias"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"max_tokens": 3, "max_completion_tokens": 4}, "max_tokens"),
    ],
)
def test_unsupported_values_are_400(extra: dict[str, Any], param: str) -> None:
    request = ChatCompletionRequest.model_validate({**CHAT, **extra})
    with pytest.raises(InvalidParameterError) as caught:
        request.check_supported()
    body = body_of(errors.from_localspec_error(caught.value))["error"]
    assert body["param"] == param


def test_neutral_values_and_extensions_are_accepted() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            **CHAT,
            "n": 1,
            "logprobs": False,
            "frequency_penalty": 0,
            "stop": "END",
            "top_k": 5,
            "min_p": 0.1,
            "draft_max": "auto",
            "speculative": False,
            "localspec": {"provenance": True},
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    request.check_supported()
    assert request.stop_strings() == ("END",)
    assert request.want_provenance and request.include_usage


def test_completion_prompt_forms() -> None:
    single = CompletionRequest.model_validate({"model": "m", "prompt": ["one"]})
    assert single.prompt_value() == "one"
    ids = CompletionRequest.model_validate({"model": "m", "prompt": [1, 2, 3]})
    assert ids.prompt_value() == [1, 2, 3]
    batch = CompletionRequest.model_validate({"model": "m", "prompt": ["a", "b"]})
    with pytest.raises(InvalidParameterError, match="one prompt"):
        batch.check_supported()


def test_engine_errors_map_to_openai_shapes() -> None:
    full = errors.from_localspec_error(QueueFullError("busy"))
    assert full.status_code == 429 and full.headers["retry-after"] == "1"
    long = body_of(errors.from_localspec_error(PromptTooLongError("too long")))["error"]
    assert long["code"] == "context_length_exceeded"
    bad = errors.from_localspec_error(InvalidParameterError("top_p=2.0 is invalid: no."))
    assert body_of(bad)["error"]["param"] == "top_p"


def test_stream_chunk_shapes() -> None:
    shape = Shape("chat", "m")
    first = shape.chunk("", role=True)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["object"] == "chat.completion.chunk" and first["id"].startswith("chatcmpl-")
    text = Shape("completion", "m").chunk("x", finish_reason="stop")
    expected = {"index": 0, "text": "x", "finish_reason": "stop", "logprobs": None}
    assert text["choices"][0] == expected


def samples(metrics: ServerMetrics) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def test_metrics_text_parses_and_sums() -> None:
    depth = [3]
    metrics = ServerMetrics(lambda: depth[0])
    stats = GenerationStats(
        prompt_tokens=7, n_tokens=10, drafted=8, accepted=6, rejected=2, target_passes=4,
        generation_seconds=0.5, time_to_first_token=0.05,
    )
    metrics.record_generation("/v1/completions", "length", stats)
    metrics.record_generation("/v1/completions", "length", stats)
    metrics.record_request("/v1/completions", 200)
    got = samples(metrics)
    assert got["localspec_prompt_tokens_total"] == 14
    assert got["localspec_generated_tokens_total"] == 20
    assert got["localspec_drafted_tokens_total"] == 16
    assert got["localspec_accepted_tokens_total"] == 12
    assert got["localspec_acceptance_rate"] == pytest.approx(0.75)
    assert got["localspec_mean_accepted_length"] == pytest.approx(2.5)
    assert got["localspec_queue_depth"] == 3
    assert got["localspec_time_per_output_token_seconds_count"] == 2
    assert got["localspec_time_per_output_token_seconds_sum"] == pytest.approx(0.1)
    assert got["localspec_generations_total{endpoint=/v1/completions,finish_reason=length}"] == 2
    assert got["localspec_http_requests_total{endpoint=/v1/completions,status=200}"] == 1
    # Each app has its own registry: a second one starts from zero.
    assert samples(ServerMetrics(lambda: 0))["localspec_prompt_tokens_total"] == 0


def test_content_parts_text_only() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    message = {"role": "developer", "content": parts}
    request = ChatCompletionRequest.model_validate({**CHAT, "messages": [message]})
    assert request.messages[0].text() == "a\nb"
    assert request.messages[0].template_role == "system"
    image = {"type": "image_url", "image_url": {"url": "data:,"}}
    error = validation_body({**CHAT, "messages": [{"role": "user", "content": [image]}]})
    assert error["param"] == "messages.0.content"
    assert "image_url" in error["message"]


def test_rejections_and_queue_wait_are_metrics() -> None:
    metrics = ServerMetrics(lambda: 0)
    before = samples(metrics)
    assert all(before[f"localspec_rejected_requests_total{{reason={r}}}"] == 0
               for r in REJECT_REASONS)  # every reason is listed from the start
    metrics.record_rejected("bad_host")
    metrics.record_queue_wait(0.3)
    got = samples(metrics)
    assert got["localspec_rejected_requests_total{reason=bad_host}"] == 1
    assert got["localspec_queue_wait_seconds_count"] == 1
    assert got["localspec_queue_wait_seconds_sum"] == pytest.approx(0.3)


def test_request_queue_places_turns_and_closing() -> None:
    async def scenario() -> None:
        waits: list[float] = []
        queue = RequestQueue(capacity=3, on_turn=waits.append)
        first, second, third = queue.admit(), queue.admit(), queue.admit()
        assert first.running and not second.running and queue.depth == 3
        with pytest.raises(QueueFullError):
            queue.admit()
        queue.release(second)  # a waiting client left: its place is free at once
        assert queue.depth == 2
        fourth = queue.admit()
        queue.release(first)
        await third.turn()  # first in, first out
        assert third.running and not fourth.running and len(waits) == 2
        with pytest.raises(QueueTimeout):
            await fourth.turn(timeout=0.01)
        closing = RuntimeError("closing")
        queue.close(closing)
        with pytest.raises(RuntimeError):
            await fourth.turn()
        with pytest.raises(RuntimeError):
            queue.admit()
        stopped: list[BaseException] = []
        third.on_stop = stopped.append
        queue.stop_running(closing)
        assert stopped == [closing]

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("header", "loopback"),
    [("localhost:8080", True), ("127.0.0.1", True), ("[::1]:80", True), ("a.localhost", True),
     ("LOCALHOST.", True), ("127.200.0.1:1", True), ("[::ffff:127.0.0.1]", True),
     ("evil.test", False), ("localhost.evil.test", False), ("10.0.0.1:8080", False),
     ("[::2]", False), ("", False)],
)
def test_loopback_host_names(header: str, loopback: bool) -> None:
    assert is_loopback(host_name(header)) is loopback


@pytest.mark.parametrize(
    ("options", "flag"),
    [
        (ServerOptions(max_queue=0), "--max-queue"),
        (ServerOptions(max_tokens=0), "--max-tokens"),
        (ServerOptions(max_connections=16), "--max-connections"),
        (ServerOptions(cors_origins=("*",)), "--cors-origin"),
        (ServerOptions(allowed_hosts=("*.lan",)), "--allowed-host"),
        (ServerOptions(request_timeout=0), "--request-timeout"),
        (ServerOptions(shutdown_timeout=-1), "--shutdown-timeout"),
    ],
)
def test_server_options_name_the_bad_flag(options: ServerOptions, flag: str) -> None:
    with pytest.raises(InvalidParameterError, match=flag):
        options.validate()
