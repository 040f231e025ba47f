"""`localspec serve` end to end: a real uvicorn server on a loopback port over a real engine
(the tiny generated target + draft model), driven by the official `openai` client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from localspec.runtime.engine import Engine
from localspec.server import create_app
from localspec.server.background import BackgroundServer
from localspec.server.options import ServerOptions
from localspec.text.chat_template import render_chat
from localspec.types import GenerationResult

API_KEY = "sk-test-key"
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello there"},
    {"role": "assistant", "content": "Hi."},
    {"role": "user", "content": "Tell me a story about a fast cat"},
]


@pytest.fixture(scope="module")
def engine(tiny_model_path: Path, tiny_draft_path: Path) -> Iterator[Engine]:
    loaded = Engine.load(
        tiny_model_path, draft=tiny_draft_path, n_ctx=1024, max_queue=16, n_threads=1
    )
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def server(engine: Engine) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(engine, ServerOptions(api_key=API_KEY))) as running:
        yield running


@pytest.fixture
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key=API_KEY, timeout=30, max_retries=0
    )


def chat_prompt(engine: Engine, messages: list[dict[str, str]]) -> str:
    info = engine.info
    assert info.chat_template
    return render_chat(
        info.chat_template, messages, bos_token=info.bos_text, eos_token=info.eos_text
    )


def expected_chat(
    engine: Engine, messages: list[dict[str, str]], **params: Any
) -> GenerationResult:
    return engine.generate(chat_prompt(engine, messages), temperature=0, **params)


def extension(body: Any) -> dict[str, Any]:
    ext = (body.model_extra or {}).get("localspec")
    assert isinstance(ext, dict), "the response lacks the localspec extension object"
    return ext


def check_extension(ext: dict[str, Any], speculative: bool = True) -> None:
    assert ext["speculative"] is speculative
    assert 0 <= ext["accepted"] <= ext["drafted"]
    assert ext["rejected"] == ext["drafted"] - ext["accepted"]
    if ext["drafted"]:
        assert ext["acceptance_rate"] == pytest.approx(ext["accepted"] / ext["drafted"])
    assert ext["mean_accepted_length"] >= 1.0
    assert ext["tokens_per_second"] > 0


def test_models_and_health(client: openai.OpenAI, server: BackgroundServer, engine: Engine) -> None:
    assert [m.id for m in client.models.list().data] == [engine.info.target_name]
    health = httpx.get(f"{server.base_url}/health", timeout=10)  # no API key needed
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_chat_sync_equals_engine_greedy(client: openai.OpenAI, engine: Engine) -> None:
    expected = expected_chat(engine, CONVERSATION, max_tokens=24)
    response = client.chat.completions.create(
        model=engine.info.target_name, messages=CONVERSATION, temperature=0, max_tokens=24,
        extra_body={"draft_max": 4},  # a fixed draft length: the draft model must be used
    )
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.text
    assert choice.finish_reason == expected.finish_reason
    assert response.usage is not None
    assert response.usage.completion_tokens == len(expected.tokens)
    assert response.usage.prompt_tokens == expected.stats.prompt_tokens
    ext = extension(response)
    check_extension(ext)
    assert ext["drafted"] > 0, "the draft model should have proposed tokens"


def test_chat_stream_equals_engine_and_reports_usage(client: openai.OpenAI, engine: Engine) -> None:
    expected = expected_chat(engine, CONVERSATION, max_tokens=24)
    stream = client.chat.completions.create(
        model=engine.info.target_name, messages=CONVERSATION, temperature=0, max_tokens=24,
        stream=True, stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    assert chunks[0].choices[0].delta.role == "assistant"
    final, usage_chunk = chunks[-2], chunks[-1]
    assert final.choices[0].finish_reason == expected.finish_reason
    check_extension(extension(final))
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == len(expected.tokens)
    assert len({c.id for c in chunks}) == 1


def test_completions_sync_and_stream_equal_engine(client: openai.OpenAI, engine: Engine) -> None:
    prompt = "Once upon a time"
    expected = engine.generate(prompt, temperature=0, max_tokens=20)
    name = engine.info.target_name
    whole = client.completions.create(model=name, prompt=prompt, temperature=0, max_tokens=20)
    assert whole.choices[0].text == expected.text
    assert whole.choices[0].finish_reason == expected.finish_reason
    check_extension(extension(whole))
    streamed = list(
        client.completions.create(
            model=name, prompt=prompt, temperature=0, max_tokens=20, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in streamed) == expected.text
    assert streamed[-1].choices[0].finish_reason == expected.finish_reason
    check_extension(extension(streamed[-1]))


def test_raw_sse_ends_with_done(server: BackgroundServer, engine: Engine) -> None:
    body = {"model": engine.info.target_name, "prompt": "Hello", "max_tokens": 8, "stream": True}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    url = f"{server.base_url}/v1/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    assert "localspec" in json.loads(lines[-2].removeprefix("data: "))


def test_provenance_on_request(client: openai.OpenAI, engine: Engine) -> None:
    expected = expected_chat(engine, CONVERSATION, max_tokens=16)
    options = {"localspec": {"provenance": True}}
    name = engine.info.target_name
    response = client.chat.completions.create(
        model=name, messages=CONVERSATION, temperature=0, max_tokens=16, extra_body=options
    )
    # Which tokens were drafted depends on the adaptive controller's state; the tokens do not.
    ext = extension(response)
    provenance = ext["provenance"]
    assert [p["id"] for p in provenance] == expected.tokens
    assert {p["source"] for p in provenance} <= {"draft", "target"}
    assert sum(p["source"] == "draft" for p in provenance) == ext["accepted"]
    stream = client.chat.completions.create(
        model=name, messages=CONVERSATION, temperature=0, max_tokens=16, extra_body=options,
        stream=True,
    )
    streamed = [p for c in stream for p in (c.model_extra or {}).get("localspec", {}).get(
        "provenance", []
    )]
    assert [p["id"] for p in streamed] == expected.tokens


def test_speculation_switches_keep_greedy_output(client: openai.OpenAI, engine: Engine) -> None:
    expected = expected_chat(engine, CONVERSATION, max_tokens=16)
    name = engine.info.target_name
    for extra, speculative in (
        ({"speculative": False}, False),
        ({"draft_max": 0}, False),
        ({"draft_max": "auto"}, True),
        ({"draft_max": 2, "top_k": 10, "min_p": 0.0}, True),
    ):
        response = client.chat.completions.create(
            model=name, messages=CONVERSATION, temperature=0, max_tokens=16, extra_body=extra
        )
        assert response.choices[0].message.content == expected.text, extra
        ext = extension(response)
        check_extension(ext, speculative=speculative)
        if not speculative:
            assert ext["drafted"] == 0 and ext["mean_accepted_length"] == pytest.approx(1.0)


def test_seeded_sampling_is_reproducible(client: openai.OpenAI, engine: Engine) -> None:
    # A fixed draft length: with "auto" the controller's timing-driven choices change how the
    # random stream is consumed, so only the distribution (not the sample) is reproducible.
    def sample() -> str:
        response = client.completions.create(
            model=engine.info.target_name, prompt="The cat", temperature=0.9, top_p=0.9,
            seed=1234, max_tokens=16, extra_body={"draft_max": 3},
        )
        return response.choices[0].text

    assert sample() == sample()


def test_stop_strings_match_engine(client: openai.OpenAI, engine: Engine) -> None:
    prompt = "Once upon a time"
    full = engine.generate(prompt, temperature=0, max_tokens=30).text
    stop = full[len(full) // 2 :][:3]
    assert stop.strip(), "the greedy continuation should have some text to stop on"
    expected = engine.generate(prompt, temperature=0, max_tokens=30, stop=(stop,))
    response = client.completions.create(
        model=engine.info.target_name, prompt=prompt, temperature=0, max_tokens=30, stop=[stop]
    )
    assert response.choices[0].text == expected.text
    assert response.choices[0].finish_reason == "stop"


def test_eight_concurrent_streams_complete_and_do_not_interleave(
    server: BackgroundServer, engine: Engine
) -> None:
    conversations = [
        [{"role": "user", "content": f"Question number {i}: what is {i} plus {i}?"}]
        for i in range(8)
    ]
    expected = [expected_chat(engine, c, max_tokens=32).text for c in conversations]

    def stream_one(messages: list[dict[str, str]]) -> tuple[str, set[str]]:
        local = openai.OpenAI(
            base_url=f"{server.base_url}/v1", api_key=API_KEY, timeout=30, max_retries=0
        )
        chunks = list(
            local.chat.completions.create(
                model=engine.info.target_name, messages=messages, temperature=0,
                max_tokens=32, stream=True,
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, {c.id for c in chunks}

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(stream_one, c) for c in conversations]
        results = [f.result(timeout=60) for f in futures]
    assert [text for text, _ in results] == expected
    ids = [id_set for _, id_set in results]
    assert all(len(s) == 1 for s in ids) and len(set.union(*ids)) == 8
    assert engine.queue_depth == 0


STRICT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System messages are not supported') }}{% endif %}"
    "[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


def test_chat_template_override_and_template_errors(engine: Engine) -> None:
    app = create_app(engine, chat_template=STRICT_TEMPLATE, model_name="custom")
    messages = CONVERSATION[1:]
    prompt = render_chat(STRICT_TEMPLATE, messages, bos_token="", eos_token="")
    expected = engine.generate(prompt, temperature=0, max_tokens=12)
    with BackgroundServer(app) as running:
        client = openai.OpenAI(base_url=f"{running.base_url}/v1", api_key="x", max_retries=0)
        response = client.chat.completions.create(
            model="custom", messages=messages, temperature=0, max_tokens=12
        )
        assert response.choices[0].message.content == expected.text
        with pytest.raises(openai.BadRequestError, match="System messages are not supported"):
            client.chat.completions.create(model="custom", messages=CONVERSATION, max_tokens=2)


def test_a_repeated_prompt_reports_its_cached_tokens_unless_cache_prompt_is_off(
    client: openai.OpenAI, engine: Engine
) -> None:
    prompt = "the cat sat on the mat and the dog sat on the log, and then"
    n_prompt = len(engine.tokenize(prompt))

    def cached(**extra: Any) -> int:
        response = client.completions.create(
            model=engine.info.target_name, prompt=prompt, temperature=0, max_tokens=4,
            extra_body=extra,
        )
        assert response.usage is not None and response.usage.prompt_tokens == n_prompt
        details = response.usage.prompt_tokens_details
        assert details is not None and details.cached_tokens is not None
        return details.cached_tokens

    cached(cache_prompt=False)
    # The prompt is in the cache now: all of it but the last token, which the first pass reads.
    assert cached() == n_prompt - 1
    assert cached(cache_prompt=False) == 0
    assert cached(cache_prompt=True) == n_prompt - 1
