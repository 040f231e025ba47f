"""Tool calls in a chat template's own syntax: which family a template speaks, and the GBNF
grammar that makes a model call one of the given tools with arguments that follow its schema.

Families (detected from the template text, as llama.cpp's common/chat.cpp does):

- ``hermes``: Hermes 2/3 and Qwen 2.5/3 -- ``<tool_call>\\n{"name": ..., "arguments": {...}}
  \\n</tool_call>``, one block per call, blocks separated by a newline.
- ``llama3``: Llama 3.1-3.3 -- one bare ``{"name": ..., "parameters": {...}}`` (after the
  ``<|python_tag|>`` control token, which does not render as text), only at the start of the
  reply.
- ``mistral``: Mistral v3 / Nemo -- ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``
  (``[TOOL_CALLS]`` is a control token in most Mistral vocabularies and may not render).

A template that renders tools in another syntax is refused by name (``UNSUPPORTED``); a
template that does not render tools at all is refused too: a model never told about its
tools would answer in plain text, silently.

The grammar writes the family's syntax in the layout of localspec.text.grammar (a space after
':' and ','), so everything but the tool's name choice and the argument values is forced text
that the forced drafter drafts for free (docs/design.md, "Grammar-forced drafting").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from localspec.errors import InvalidParameterError
from localspec.text.grammar import SCHEMA_COMMON_RULES, json_schema_rules


@dataclass(frozen=True)
class ToolFamily:
    """How one template family writes tool calls."""

    name: str  # "hermes", "llama3", "mistral"
    label: str  # for people: docs and error messages
    args_key: str  # the key that holds the arguments object
    parallel: bool  # whether the syntax holds several calls in one reply


HERMES = ToolFamily("hermes", "Hermes/Qwen <tool_call>", "arguments", True)
LLAMA3 = ToolFamily("llama3", "Llama 3.x JSON", "parameters", False)
MISTRAL = ToolFamily("mistral", "Mistral [TOOL_CALLS]", "arguments", True)

# Markers of tool syntaxes localspec does not parse, with the family's name for the 400.
UNSUPPORTED = (
    ("[ARGS]", "Mistral [TOOL_CALLS]name[ARGS] (Magistral/Devstral)"),
    ("<function=", "XML <function=...> (Qwen3-Coder, Functionary)"),
    (" functools[", "FireFunction"),
    ("<|channel|>", "GPT-OSS harmony"),
    ("<｜tool▁calls▁begin｜>", "DeepSeek"),
    ("<|START_ACTION|>", "Command R7B"),
    ("<start_function_call>", "FunctionGemma"),
    ("<|tool_call_begin|>", "Kimi K2"),
    ("<|tool_calls_section_begin|>", "Kimi K2"),
)

# Tool names as OpenAI accepts them; they are written into grammars and templates as they are.
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def unsupported(message: str) -> InvalidParameterError:
    error = InvalidParameterError(message)
    error.param = "tools"  # type: ignore[attr-defined]
    return error


def detect_family(template: str) -> ToolFamily:
    """The family whose calls ``template`` renders; InvalidParameterError (param ``tools``)
    naming the family when localspec does not parse it, or when the template ignores tools."""
    for marker, family in UNSUPPORTED:
        if marker in template:
            raise unsupported(f"The model's chat template writes tool calls in the {family} "
                              "format, which localspec does not parse; supported: "
                              f"{HERMES.label}, {LLAMA3.label}, {MISTRAL.label}.")
    if "<tool_call>" in template:
        return HERMES
    if "<|start_header_id|>" in template and "ipython" in template:
        return LLAMA3
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "tools" in template:
        raise unsupported("The model's chat template renders tools in a format localspec does "
                          f"not recognize; supported: {HERMES.label}, {LLAMA3.label}, "
                          f"{MISTRAL.label}. Load the model with a supported chat_template.")
    raise unsupported("The model's chat template does not render tools, so the model would "
                      "never see them; load it with a chat_template that does (a Hermes/Qwen, "
                      "Llama 3.x or Mistral one), or send the request without tools.")


@lru_cache(maxsize=8)
def family_of(template: str) -> ToolFamily | None:
    """The family of ``template``, or None (never an error): for rendering a conversation's
    calls when no tools are offered."""
    try:
        return detect_family(template)
    except InvalidParameterError:
        return None


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call: its name and the JSON Schema of its arguments object."""

    name: str
    parameters: dict[str, Any]


def _literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def arguments_rules(tool: ToolSpec, prefix: str) -> tuple[str, dict[str, str]]:
    """The grammar of ``tool``'s arguments object; InvalidParameterError for a schema the
    grammar cannot enforce or that does not describe an object."""
    kind = tool.parameters.get("type")
    if kind not in (None, "object"):
        raise InvalidParameterError(
            f"The parameters of tool '{tool.name}' must be a JSON Schema of an object "
            f"(type 'object'), not of type {json.dumps(kind)[:40]}.")
    expression, rules = json_schema_rules(tool.parameters, prefix)
    return ("object" if expression == "value" else expression), rules


def tool_call_grammar(family: ToolFamily, tools: list[ToolSpec], *, parallel: bool) -> str:
    """A GBNF grammar whose sentences are one call (several when ``parallel`` and the family
    allows them) of one of ``tools``, in ``family``'s syntax, with arguments that follow the
    tool's schema. Errors name the tool; the caller adds the parameter."""
    rules: dict[str, str] = {}
    calls = []
    for index, tool in enumerate(tools):
        try:
            arguments, own = arguments_rules(tool, f"t{index}-")
        except InvalidParameterError as error:
            raise InvalidParameterError(
                f"tools[{index}] ('{tool.name}'): {error}") from None
        rules.update(own)
        head = _literal(f'{{"name": {json.dumps(tool.name)}, "{family.args_key}": ')
        rules[f"call{index}"] = f'{head} {arguments} "}}"'
        calls.append(f"call{index}")
    rules["call"] = " | ".join(calls)
    several = parallel and family.parallel
    if family is HERMES:
        block = r'"<tool_call>\n" call "\n</tool_call>"'
        root = f"{block} ( \"\\n\" {block} )*" if several else block
    elif family is LLAMA3:
        root = "call"
    else:
        root = '"[TOOL_CALLS][" call ' + ('( ", " call )* ' if several else "") + '"]"'
    lines = [f"root ::= {root}"] + [f"{name} ::= {body}" for name, body in rules.items()]
    return "\n".join(lines) + "\n" + SCHEMA_COMMON_RULES
