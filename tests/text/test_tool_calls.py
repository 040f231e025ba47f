"""Tool-call families: detection from chat templates, the call grammars, and the parser on
replies as the models write them (the examples of Qwen's, Hermes', Llama 3.1's and Mistral's
documentation), whole and streamed at every split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localspec.errors import InvalidParameterError
from localspec.text.grammar_check import check_grammar
from localspec.text.tool_calls import (
    HERMES,
    LLAMA3,
    MISTRAL,
    ToolFamily,
    ToolSpec,
    detect_family,
    tool_call_grammar,
)
from localspec.text.tool_parse import (
    ArgumentsDelta,
    CallStart,
    ContentDelta,
    Delta,
    ToolCallParser,
    parse_reply,
)

QWEN_GGUF = Path("/work/pair-cache2/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")

QWEN_TWO_CALLS = (
    '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": '
    '"San Francisco, CA, USA"}}\n</tool_call>\n<tool_call>\n{"name": "get_temperature_date", '
    '"arguments": {"location": "San Francisco, CA, USA", "date": "2024-10-01"}}\n</tool_call>'
)
HERMES_ARGS_FIRST = ('<tool_call>\n{"arguments": {"symbol": "TSLA"}, "name": '
                     '"get_stock_fundamentals"}\n</tool_call>')
LLAMA_CALL = ('{"name": "get_current_conditions", "parameters": {"location": "San Francisco, '
              'CA", "unit": "Fahrenheit"}}')
MISTRAL_CALL = ('[TOOL_CALLS] [{"name": "get_current_weather", "arguments": {"location": '
                '"Paris, France", "format": "celsius"}, "id": "0UAqFzWsD"}]')

REPLIES: list[tuple[ToolFamily, str, str | None, list[tuple[str, dict[str, object]]]]] = [
    (HERMES, QWEN_TWO_CALLS, None, [
        ("get_current_temperature", {"location": "San Francisco, CA, USA"}),
        ("get_temperature_date", {"location": "San Francisco, CA, USA", "date": "2024-10-01"})]),
    (HERMES, HERMES_ARGS_FIRST, None, [("get_stock_fundamentals", {"symbol": "TSLA"})]),
    (HERMES, "I will look it up.\n\n" + QWEN_TWO_CALLS[:QWEN_TWO_CALLS.index("\n<tool_call>")],
     "I will look it up.", [("get_current_temperature", {"location": "San Francisco, CA, USA"})]),
    (HERMES, '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": [1, \\"}\\"]}"}\n</tool_call>',
     None, [("f", {"x": [1, "}"]})]),
    (HERMES, "Paris is sunny today, 18 C.", "Paris is sunny today, 18 C.", []),
    # Qwen2.5-Coder 1.5B, tool_choice "auto": a call written as a JSON code block
    (HERMES, '```json\n{\n  "name": "read_file",\n  "arguments": {\n    "path": "setup.py"\n'
             '  }\n}\n```', None, [("read_file", {"path": "setup.py"})]),
    (HERMES, "Like this:\n```python\nprint({'name': 1})\n```\nDone.",
     "Like this:\n```python\nprint({'name': 1})\n```\nDone.", []),
    (HERMES, 'The data:\n```json\n{"a": 1}\n```', 'The data:\n```json\n{"a": 1}\n```', []),
    (HERMES, '```json\n{"a": 1}\n```\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
     '```json\n{"a": 1}\n```', [("f", {})]),
    # cut by max_tokens inside the close tag: the tag is markup, not content
    (HERMES, '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_', None,
     [("f", {"x": 1})]),
    (HERMES, "Wrap calls in <tool_call> tags.", "Wrap calls in <tool_call> tags.", []),
    (HERMES, "<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", []),
    (LLAMA3, LLAMA_CALL, None, [("get_current_conditions", {"location": "San Francisco, CA",
                                                            "unit": "Fahrenheit"})]),
    (LLAMA3, '<|python_tag|>{"type": "function", "name": "a", "parameters": {"n": -2.5e1}}; '
             '{"name": "b", "parameters": {"ok": true, "tags": null}}',
     None, [("a", {"n": -25.0}), ("b", {"ok": True, "tags": None})]),
    (LLAMA3, '{"answer": 42}', '{"answer": 42}', []),
    (LLAMA3, 'The call would be {"name": "x", "parameters": {}}',
     'The call would be {"name": "x", "parameters": {}}', []),
    (MISTRAL, MISTRAL_CALL, None, [("get_current_weather", {"location": "Paris, France",
                                                            "format": "celsius"})]),
    # [TOOL_CALLS] is a control token in Mistral vocabularies: it renders as nothing
    (MISTRAL, MISTRAL_CALL[len("[TOOL_CALLS] "):], None,
     [("get_current_weather", {"location": "Paris, France", "format": "celsius"})]),
    (MISTRAL, '[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b", "arguments": '
              '{"q": "[x]"}}]', None, [("a", {}), ("b", {"q": "[x]"})]),
    (MISTRAL, "[1, 2] is a list.", "[1, 2] is a list.", []),
]


def collect(deltas: list[Delta]) -> tuple[str | None, list[tuple[str, str]]]:
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    names = [d.name for d in deltas if isinstance(d, CallStart)]
    arguments = ["" for _ in names]
    for delta in deltas:
        if isinstance(delta, ArgumentsDelta):
            arguments[delta.index] += delta.text
    calls = list(zip(names, arguments, strict=True))
    return (content or None) if calls else content, calls


@pytest.mark.parametrize(("family", "reply", "content", "calls"), REPLIES)
def test_replies_parse_whole(family: ToolFamily, reply: str, content: str | None,
                             calls: list[tuple[str, dict[str, object]]]) -> None:
    parsed_content, parsed = parse_reply(family, reply)
    assert parsed_content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == calls


@pytest.mark.parametrize(("family", "reply", "content", "calls"), REPLIES)
def test_streams_split_anywhere_say_the_same(family: ToolFamily, reply: str,
                                             content: str | None,
                                             calls: list[tuple[str, dict[str, object]]]) -> None:
    whole_content, whole = parse_reply(family, reply)
    expected = (whole_content, [(c.name, c.arguments) for c in whole])
    splits = [[reply[:i], reply[i:]] for i in range(len(reply) + 1)] + [list(reply)]
    for pieces in splits:
        parser = ToolCallParser(family)
        deltas = [d for piece in pieces for d in parser.feed(piece)] + parser.finish()
        assert collect(deltas) == expected, pieces
        if calls:  # no markup in the content, even for a moment
            for delta in deltas:
                if isinstance(delta, ContentDelta):
                    assert "<tool_call" not in delta.text and "[TOOL_CALLS" not in delta.text
                    assert '"name"' not in delta.text


def test_a_call_cut_short_keeps_what_was_written() -> None:
    content, calls = parse_reply(HERMES, '<tool_call>\n{"name": "f", "arguments": {"x": ')
    assert content is None and [(c.name, c.arguments) for c in calls] == [("f", '{"x": ')]
    content, calls = parse_reply(HERMES, '<tool_call>\n{"na')
    assert content == '<tool_call>\n{"na' and calls == []


def test_families_are_detected_from_template_text() -> None:
    assert detect_family("... <tool_call>\\n{\"name\": ...") is HERMES
    assert detect_family("<|start_header_id|>ipython<|end_header_id|> {{ tools }}") is LLAMA3
    assert detect_family("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]") is MISTRAL


@pytest.mark.parametrize(("template", "named"), [
    ("<|channel|>commentary {{ tools }}", "GPT-OSS harmony"),
    ("[TOOL_CALLS]{{ name }}[ARGS]{{ arguments }}", "Magistral"),
    ("<function={{ name }}> {{ tools }}", "Qwen3-Coder"),
    ("{% for tool in tools %}{{ tool }}{% endfor %}", "does not recognize"),
    ("{% for m in messages %}{{ m.content }}{% endfor %}", "does not render tools"),
])
def test_other_templates_are_refused_by_name(template: str, named: str) -> None:
    with pytest.raises(InvalidParameterError, match=named) as caught:
        detect_family(template)
    assert caught.value.param == "tools"  # type: ignore[attr-defined]


@pytest.mark.skipif(not QWEN_GGUF.is_file(), reason="the real Qwen2.5-Coder GGUF is absent")
def test_the_real_qwen_template_is_hermes() -> None:
    import gguf

    field = gguf.GGUFReader(QWEN_GGUF).fields["tokenizer.chat_template"]
    assert detect_family(bytes(field.parts[field.data[0]]).decode()) is HERMES


TOOLS = [
    ToolSpec("get_weather", {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}),
    ToolSpec("ping", {}),
]


@pytest.mark.parametrize("family", [HERMES, LLAMA3, MISTRAL])
@pytest.mark.parametrize("parallel", [True, False])
def test_call_grammars_pass_the_grammar_check(family: ToolFamily, parallel: bool) -> None:
    grammar = tool_call_grammar(family, TOOLS, parallel=parallel)
    check_grammar(grammar, n_vocab=1000)
    head = json.dumps("{\"name\": \"get_weather\", \"" + family.args_key + "\": ")
    assert head in grammar  # the call's syntax is one literal: forced text
    assert ("( \"\\n\" " in grammar or '( ", " call )*' in grammar) == (
        parallel and family.parallel)


def test_a_schema_the_grammar_cannot_enforce_names_the_tool() -> None:
    bad = ToolSpec("lookup", {"type": "object", "properties": {"id": {"type": "string",
                                                                      "pattern": "^x"}}})
    with pytest.raises(InvalidParameterError, match=r"tools\[1\] \('lookup'\).*pattern"):
        tool_call_grammar(HERMES, [TOOLS[0], bad], parallel=True)
    with pytest.raises(InvalidParameterError, match="must be a JSON Schema of an object"):
        tool_call_grammar(HERMES, [ToolSpec("n", {"type": "integer"})], parallel=True)
