"""Tool calls on /v1/chat/completions (issue 49): a real server on loopback over a tiny
generated model whose GGUF carries a Hermes/Qwen-style template with tools, driven by the
official `openai` client and LangChain's ChatOpenAI.bind_tools. A tiny random model would not
call a tool by itself: "required" and named calls are what the grammar guarantees."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from localspec.runtime.engine import Engine
from localspec.server import create_app
from localspec.server.background import BackgroundServer
from localspec.server.options import ServerOptions
from localspec.testing.synthetic import TOOLS_CHAT_TEMPLATE, write_model
from localspec.text.chat_template import render_chat
from localspec.text.schema_check import schema_violation

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                   "exact": {"type": "boolean"}},
    "required": ["a", "b"],
}
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": name, "description": f"The {name} tool.",
                                      "parameters": schema}}
    for name, schema in SCHEMAS.items()
]
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
# Llama 3.x and Mistral families, as far as detection and rendering go (tiny stand-ins).
LLAMA3_TEMPLATE = (
    "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{{ m.content }}<|eot_id|>{% endfor %}{% if tools %}<|start_header_id|>ipython"
    "<|end_header_id|>\n\n{{ tools | tojson }}<|eot_id|>{% endif %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)
MISTRAL_TEMPLATE = (
    "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{% elif m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | tojson }}"
    "{% else %}{{ m.content }}{% endif %}{% endfor %}"
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    path = write_model(tmp_path_factory.mktemp("tools") / "tiny-tools.gguf",
                       chat_template=TOOLS_CHAT_TEMPLATE, name="tiny-tools")
    loaded = Engine.load(path, draft="ngram", n_ctx=4096, n_threads=1)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def server(engine: Engine) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(engine, ServerOptions())) as running:
        yield running


@pytest.fixture
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", timeout=60,
                         max_retries=0)


def check_call(name: str, arguments: str) -> None:
    assert name in SCHEMAS
    assert schema_violation(arguments, SCHEMAS[name]) is None, arguments


def test_required_calls_parse_and_follow_their_schema(client: openai.OpenAI,
                                                      engine: Engine) -> None:
    response = client.chat.completions.create(
        model=engine.info.target_name, messages=ASK, tools=TOOLS, tool_choice="required",
        temperature=0, max_tokens=200, parallel_tool_calls=False,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].id.startswith("call_") and calls[0].type == "function"
    check_call(calls[0].function.name, calls[0].function.arguments)
    ext = (response.model_extra or {})["localspec"]
    assert ext["drafted_by_kind"].get("forced", 0) > 0, "the call's syntax is forced text"


def test_a_named_function_is_the_one_called(client: openai.OpenAI, engine: Engine) -> None:
    named: Any = {"type": "function", "function": {"name": "add"}}
    response = client.chat.completions.create(
        model=engine.info.target_name, messages=ASK, tools=TOOLS, temperature=0,
        tool_choice=named, max_tokens=200,
    )
    calls = response.choices[0].message.tool_calls
    assert calls is not None and [c.function.name for c in calls] == ["add"]
    check_call("add", calls[0].function.arguments)


def test_streamed_calls_are_reassembled_by_the_client(client: openai.OpenAI,
                                                      engine: Engine) -> None:
    request: dict[str, Any] = dict(model=engine.info.target_name, messages=ASK, tools=TOOLS,
                                   tool_choice="required", temperature=0, max_tokens=200)
    whole = client.chat.completions.create(**request).choices[0].message
    chunks = list(client.chat.completions.create(**request, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert all(not d.content for d in deltas), "no call markup leaks into the content"
    parts = [call for d in deltas for call in d.tool_calls or []]
    assert parts[0].id and parts[0].type == "function" and parts[0].function.name
    assert len(parts) > 2, "the arguments arrive in fragments"
    assert all(p.id is None and p.function.name is None for p in parts[1:]
               if p.index == parts[0].index)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    with client.chat.completions.stream(**request) as stream:
        final = stream.get_final_completion().choices[0].message
    assert final.tool_calls is not None and whole.tool_calls is not None
    assert [(c.function.name, c.function.arguments) for c in final.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole.tool_calls]
    for call in final.tool_calls:
        check_call(call.function.name, call.function.arguments)


def test_auto_text_streams_as_it_is_answered_whole(client: openai.OpenAI,
                                                  engine: Engine) -> None:
    """A reply with no call (a tiny random model's, in "auto"): content only, streamed the
    same as whole, the text the template's prompt gives plainly."""
    request: dict[str, Any] = dict(model=engine.info.target_name, messages=ASK, tools=TOOLS,
                                   temperature=0, max_tokens=16)
    whole = client.chat.completions.create(**request).choices[0]
    chunks = list(client.chat.completions.create(**request, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.message.tool_calls is None and whole.finish_reason == "length"
    assert streamed == whole.message.content and streamed


def test_a_tool_result_goes_back_through_the_template(client: openai.OpenAI,
                                                      engine: Engine) -> None:
    arguments = '{"city": "Paris", "unit": "celsius"}'
    call = {"id": "call_abc", "type": "function",
            "function": {"name": "get_weather", "arguments": arguments}}
    messages: list[Any] = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                           {"role": "tool", "tool_call_id": "call_abc", "content": "18 C, sunny"}]
    response = client.chat.completions.create(
        model=engine.info.target_name, messages=messages, tools=TOOLS, temperature=0,
        max_tokens=12)
    info = engine.info
    rendered = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {**call, "function": {"name": "get_weather", "arguments": {"city": "Paris",
                                                                  "unit": "celsius"}}}]},
        {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_abc"}]
    prompt = render_chat(info.chat_template or "", rendered, bos_token=info.bos_text,
                         eos_token=info.eos_text, tools=TOOLS)
    assert '<tool_response>\n18 C, sunny' in prompt and '"arguments": {"city": "Paris"' in prompt
    expected = engine.generate(prompt, temperature=0, max_tokens=12)
    assert response.choices[0].message.content == expected.text
    assert response.usage is not None
    assert response.usage.prompt_tokens == expected.stats.prompt_tokens


def test_langchain_bind_tools(server: BackgroundServer, engine: Engine) -> None:
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(base_url=f"{server.base_url}/v1", api_key="none",  # type: ignore[arg-type]
                       model=engine.info.target_name, temperature=0, max_tokens=200)
    reply = model.bind_tools(TOOLS, tool_choice="required").invoke("Weather in Paris?")
    assert reply.tool_calls, reply
    for call in reply.tool_calls:
        check_call(call["name"], json.dumps(call["args"]))


@pytest.mark.parametrize(("template", "family"), [(LLAMA3_TEMPLATE, "llama3"),
                                                  (MISTRAL_TEMPLATE, "mistral")])
def test_other_families_are_forced_and_parsed(engine: Engine, template: str,
                                              family: str) -> None:
    with BackgroundServer(create_app(engine, ServerOptions(), chat_template=template)) as other:
        body = {"model": engine.info.target_name, "messages": ASK, "tools": TOOLS,
                "tool_choice": "required", "temperature": 0, "max_tokens": 200,
                "parallel_tool_calls": False}
        answer = httpx.post(f"{other.base_url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", (family, choice)
    for call in choice["message"]["tool_calls"]:
        check_call(call["function"]["name"], call["function"]["arguments"])


def test_mistral_templates_get_nine_character_ids() -> None:
    """Mistral's templates refuse other call ids: a call and its result map to the same one."""
    from localspec.server.schemas import ChatMessage
    from localspec.server.tools import template_message
    from localspec.text.tool_calls import HERMES, MISTRAL

    call = ChatMessage.model_validate({"role": "assistant", "tool_calls": [{
        "id": "call_abc", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
    result = ChatMessage.model_validate({"role": "tool", "tool_call_id": "call_abc",
                                         "content": "ok"})
    mapped = template_message(call, 0, MISTRAL)["tool_calls"][0]["id"]
    assert len(mapped) == 9 and mapped.isalnum()
    assert template_message(result, 1, MISTRAL)["tool_call_id"] == mapped
    assert template_message(result, 1, HERMES)["tool_call_id"] == "call_abc"
    assert template_message(call, 0, HERMES)["tool_calls"][0]["function"]["arguments"] == {}


def post(server: BackgroundServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)


BAD_SCHEMA = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^a"}}}
BAD = [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "function"}]}, "tools.0.function"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools.0.type"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
     "tools.0.function.name"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools.1.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": BAD_SCHEMA}}],
      "tool_choice": "required"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "string"}}}]}, "tools.0.function.parameters"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"messages": [*ASK, {"role": "tool", "content": "18 C"}]}, "messages.1.tool_call_id"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                              "function": {"name": "f",
                                                                           "arguments": "{"}}]}]},
     "messages.1.tool_calls.0.function.arguments"),
]


@pytest.mark.parametrize(("extra", "param"), BAD)
def test_bad_tool_requests_are_400_naming_the_parameter(
        server: BackgroundServer, engine: Engine, extra: dict[str, Any], param: str) -> None:
    answer = post(server, {"model": engine.info.target_name, "messages": ASK, "max_tokens": 4,
                           **extra})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"


def test_a_template_without_tools_is_refused_by_name(engine: Engine) -> None:
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n" \
             "{% endfor %}<|im_start|>assistant\n"
    with BackgroundServer(create_app(engine, ServerOptions(), chat_template=chatml)) as plain:
        answer = post(plain, {"model": engine.info.target_name, "messages": ASK, "tools": TOOLS})
        unsupported = post(plain, {"model": engine.info.target_name, "messages": ASK,
                                   "tools": TOOLS, "tool_choice": "none", "max_tokens": 4})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "tools"
    assert "does not render tools" in answer.json()["error"]["message"]
    assert unsupported.status_code == 200  # "none": the tools are not rendered


def test_an_unsupported_family_is_named(engine: Engine) -> None:
    harmony = TOOLS_CHAT_TEMPLATE.replace("<tool_call>", "<|channel|>commentary")
    with BackgroundServer(create_app(engine, ServerOptions(), chat_template=harmony)) as other:
        answer = post(other, {"model": engine.info.target_name, "messages": ASK, "tools": TOOLS})
    assert answer.status_code == 400
    assert "GPT-OSS harmony" in answer.json()["error"]["message"]


def test_the_real_pair_calls_a_tool_that_validates(real_pair: Any) -> None:
    """Qwen2.5-Coder 1.5B drafted by 0.5B, its own template (tests/conftest.py, real_pair): a
    required call parses and follows the schema, and its syntax was drafted as forced text."""
    real = Engine.load(real_pair.target, real_pair.drafter, n_ctx=2048)
    try:
        with BackgroundServer(create_app(real, ServerOptions())) as running:
            client = openai.OpenAI(base_url=f"{running.base_url}/v1", api_key="none",
                                   timeout=300, max_retries=0)
            response = client.chat.completions.create(
                model=real.info.target_name, messages=ASK, tools=TOOLS, temperature=0,
                tool_choice="required", max_tokens=40, parallel_tool_calls=False)
    finally:
        real.close()
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0].function
    assert call.name == "get_weather"  # the one that fits the question
    check_call(call.name, call.arguments)
    assert json.loads(call.arguments)["city"] == "Paris"
    ext = (response.model_extra or {})["localspec"]
    assert ext["accepted_by_kind"].get("forced", 0) > 0
