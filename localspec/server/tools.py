"""Tool calls on /v1/chat/completions: the request's ``tools``, ``tool_choice`` and
``parallel_tool_calls``, the conversation's calls and results as the template sees them, and
the reply's calls in OpenAI's shapes (whole and streamed).

``tool_choice``: "auto" (the default with tools) generates freely and parses the reply;
"required" and a named function constrain the reply with the grammar of a call
(localspec.text.tool_calls), so it always parses and its arguments follow the tool's schema;
"none" renders no tools and parses nothing. docs/server.md, "Tools".
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from localspec.errors import InvalidParameterError
from localspec.text.tool_calls import (
    MISTRAL,
    TOOL_NAME,
    ToolFamily,
    ToolSpec,
    detect_family,
    tool_call_grammar,
)
from localspec.text.tool_parse import ArgumentsDelta, CallStart, ContentDelta, ToolCallParser

MAX_TOOLS = 128  # OpenAI's limit on one request's tools


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionDef(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # always on for required / named calls


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


class FunctionCallIn(BaseModel):
    """A call in an assistant message the client sends back (its extra fields ignored)."""

    model_config = ConfigDict(extra="ignore")

    name: str
    arguments: str


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


def bad(param: str, message: str) -> InvalidParameterError:
    error = InvalidParameterError(message)
    error.param = param  # type: ignore[attr-defined]
    return error


def check_tool_request(tools: list[Tool] | None, choice: ToolChoice | None) -> None:
    """The tools and the choice make sense together (names, limits, a named tool exists)."""
    if tools is not None and len(tools) > MAX_TOOLS:
        raise bad("tools", f"Too many tools ({len(tools)}); send at most {MAX_TOOLS}.")
    names = [tool.function.name for tool in tools or []]
    for index, name in enumerate(names):
        if not TOOL_NAME.fullmatch(name):
            raise bad(f"tools.{index}.function.name",
                      f"Invalid tool name {name[:70]!r}: use 1-64 letters, digits, '_' or '-'.")
        if name in names[:index]:
            raise bad(f"tools.{index}.function.name", f"Two tools are named '{name}'.")
    if choice is None or choice == "none" or choice == "auto":
        return
    if not names:
        raise bad("tool_choice", "tool_choice needs tools: send the tools the model may call.")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise bad("tool_choice", f"tool_choice names the function '{choice.function.name[:70]}'"
                  ", which is not among the tools.")


@dataclass(frozen=True)
class ToolPlan:
    """What answering a request with tools needs: the family to parse, the forcing choice."""

    family: ToolFamily
    choice: str  # "auto", "required" or "named"
    grammar: str | None  # the call grammar for "required" and "named"
    template_tools: list[dict[str, Any]] = field(default_factory=list)


def plan_tools(tools: list[Tool] | None, choice: ToolChoice | None, parallel: bool | None,
               template: str) -> ToolPlan | None:
    """None when the reply is plain text (no tools, or tool_choice "none"); else the plan,
    with the grammar built when the choice forces a call. Errors name the parameter."""
    if not tools or choice == "none":
        return None
    family = detect_family(template)
    kind = "named" if isinstance(choice, NamedToolChoice) else (choice or "auto")
    chosen = tools
    if isinstance(choice, NamedToolChoice):
        chosen = [t for t in tools if t.function.name == choice.function.name]
    grammar = None
    if kind != "auto":
        specs = [ToolSpec(t.function.name, t.function.parameters or {"type": "object"})
                 for t in chosen]
        try:
            grammar = tool_call_grammar(family, specs, parallel=parallel is not False
                                        and kind == "required")
        except InvalidParameterError as error:
            raise bad("tools", str(error)) from None
    else:
        for index, tool in enumerate(tools):
            kind_of = (tool.function.parameters or {}).get("type", "object")
            if kind_of != "object":
                raise bad(f"tools.{index}.function.parameters",
                          f"The parameters of tool '{tool.function.name}' must be a JSON "
                          "Schema of an object (type 'object').")
    listed = [t.model_dump(exclude_none=True) for t in tools]
    return ToolPlan(family, kind, grammar, listed)


def template_message(message: Any, index: int, family: ToolFamily | None) -> dict[str, Any]:
    """One request message as chat templates expect it: calls with their arguments as an
    object (Hugging Face's convention, which Qwen's and Llama's templates render), a tool
    result with its call's id. Mistral templates demand 9-character ids: others are mapped
    to one, the same for a call and its result."""
    out: dict[str, Any] = {"role": message.template_role, "content": message.text()}
    if message.role == "tool":
        if not message.tool_call_id:
            raise bad(f"messages.{index}.tool_call_id",
                      "A tool message needs the tool_call_id of the call it answers.")
        out["tool_call_id"] = _template_id(message.tool_call_id, family)
        if message.name:
            out["name"] = message.name
    if message.tool_calls:
        calls = []
        for number, call in enumerate(message.tool_calls):
            arguments = _loads(call.function.arguments)
            if not isinstance(arguments, dict):
                raise bad(f"messages.{index}.tool_calls.{number}.function.arguments",
                          "A call's arguments must be a JSON object, as a string.")
            calls.append({"id": _template_id(call.id, family), "type": "function",
                          "function": {"name": call.function.name, "arguments": arguments}})
        out["tool_calls"] = calls
    return out


def _template_id(call_id: str, family: ToolFamily | None) -> str:
    if family is MISTRAL and not (len(call_id) == 9 and call_id.isalnum()):
        return hashlib.sha256(call_id.encode()).hexdigest()[:9]
    return call_id


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


class ToolReply:
    """The reply of a request with tools, read as it arrives: ``push`` returns the stream
    deltas (OpenAI's ``delta`` objects) that the new text makes certain; ``message`` is the
    whole reply's message once ``finish`` was called."""

    def __init__(self, family: ToolFamily) -> None:
        self._parser = ToolCallParser(family)
        self.content = ""
        self.calls: list[dict[str, Any]] = []

    def push(self, text: str) -> list[dict[str, Any]]:
        return self._deltas(self._parser.feed(text))

    def finish(self) -> list[dict[str, Any]]:
        return self._deltas(self._parser.finish())

    def _deltas(self, parsed: list[ContentDelta | CallStart | ArgumentsDelta]) -> list[
            dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for delta in parsed:
            if isinstance(delta, ContentDelta):
                self.content += delta.text
                out.append({"content": delta.text})
            elif isinstance(delta, CallStart):
                call = {"id": new_call_id(), "type": "function",
                        "function": {"name": delta.name, "arguments": ""}}
                self.calls.append(call)
                out.append({"tool_calls": [{"index": delta.index, **call}]})
            else:
                self.calls[delta.index]["function"]["arguments"] += delta.text
                out.append({"tool_calls": [{"index": delta.index,
                                            "function": {"arguments": delta.text}}]})
        return out

    def message(self) -> dict[str, Any]:
        if not self.calls:
            return {"role": "assistant", "content": self.content}
        return {"role": "assistant", "content": self.content or None, "tool_calls": self.calls}

    def finish_reason(self, reason: str) -> str:
        """OpenAI's "tool_calls" when the reply ended by itself after calling."""
        return "tool_calls" if self.calls and reason == "stop" else reason
