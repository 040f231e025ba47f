"""Reading a model's tool calls out of its reply, incrementally, for the families of
localspec.text.tool_calls.

One parser serves streams and whole replies alike (a whole reply is fed at once), so both
answer the same: ``feed`` takes text as it is generated and returns what is now certain --
content, the start of a call (its name), fragments of its arguments -- and ``finish`` flushes
the end. Text that may be the start of a call is held back, so no call markup ever reaches
the content.

Invariants: the content is the reply's text outside the calls (whitespace next to a call
dropped); a call's arguments are the raw JSON text the model wrote for them, sent in order,
so the fragments of a stream concatenate to the arguments of the whole reply. Text that turns
out not to be a call (malformed JSON, an object that is not a call) goes to the content from
where the call seemed to start, and the rest of the reply is content too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from localspec.text.tool_calls import HERMES, LLAMA3, ToolFamily

_SPACE = " \t\r\n"
_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_MISTRAL_OPEN = "[TOOL_CALLS]"
# Hermes-family models (Qwen2.5-Coder among them) also write a call as a JSON code block:
# ```json\n{"name": ...}\n``` (llama.cpp's Hermes parser accepts it too).
_FENCE = "```"
_FENCE_HEADER = re.compile(r"(?:json|JSON|xml)?[ \t]*\n[ \t\r\n]*")
_FENCE_PARTIAL = re.compile(r"(?:j(?:s(?:on?)?)?|J(?:S(?:ON?)?)?|x(?:ml?)?|json|JSON|xml)?[ \t]*")
_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    name: str


@dataclass(frozen=True)
class ArgumentsDelta:
    index: int
    text: str


Delta = ContentDelta | CallStart | ArgumentsDelta


class _Malformed(Exception):
    """The text is not a call after all."""


class _CallObject:
    """Scans one call object ``{"name": ..., "arguments": {...}, ...}`` character by
    character. ``name`` once read; ``arguments`` grows as its characters arrive."""

    def __init__(self, args_keys: tuple[str, ...], first_keys: tuple[str, ...] | None) -> None:
        self.args_keys = args_keys
        self.first_keys = first_keys  # the keys a call may start with (None: any)
        self.name: str | None = None
        self.arguments = ""
        self.done = False
        self._state = "open"
        self._key = ""
        self._raw = ""  # the current key or string value, escapes and all
        self._keys = 0
        self._string_args = False
        self._depth = 0  # inside a raw value: open containers, a string, a scalar
        self._in_string = False
        self._escape = False
        self._scalar = False

    def push(self, char: str) -> None:
        state = self._state
        if state in ("open", "key_or_end", "colon", "value", "after") and char in _SPACE:
            return
        if state == "open":
            self._expect(char == "{")
            self._state = "key_or_end"
        elif state == "key_or_end":
            self._expect(char == '"')
            self._raw, self._state = "", "key"
        elif state in ("key", "string"):
            self._string_char(char)
        elif state == "colon":
            self._expect(char == ":")
            self._state = "value"
        elif state == "value":
            self._start_value(char)
        elif state == "raw":
            self._raw_value(char)
        elif state == "after" and char == "}":
            self._expect(self.name is not None)
            self.done, self._state = True, "done"
        else:
            self._expect(state == "after" and char == ",")
            self._state = "key_or_end"

    @staticmethod
    def _expect(condition: bool) -> None:
        if not condition:
            raise _Malformed

    def _string_char(self, char: str) -> None:
        if self._escape:
            self._escape = False
        elif char == "\\":
            self._escape = True
        elif char == '"':
            self._end_string()
            return
        self._raw += char

    def _end_string(self) -> None:
        text = _loads(f'"{self._raw}"')
        self._expect(isinstance(text, str))
        assert isinstance(text, str)
        if self._state == "key":
            if self._keys == 0 and self.first_keys is not None:
                self._expect(text in self.first_keys)
            self._key, self._state, self._keys = text, "colon", self._keys + 1
            return
        if self._key == "name":
            self.name = text
        elif self._string_args:  # arguments sent as a JSON string holding the object
            self._expect(isinstance(_loads(text), dict))
            self.arguments += text
        self._state = "after"

    def _start_value(self, char: str) -> None:
        if self._key == "name" or (self._key in self.args_keys and char == '"'):
            self._expect(char == '"')
            self._string_args = self._key != "name"
            self._raw, self._state = "", "string"
            return
        if self._key in self.args_keys:
            self._expect(char == "{")
        self._depth, self._in_string, self._escape, self._scalar = 0, False, False, False
        self._state = "raw"
        self._raw_value(char)

    def _raw_value(self, char: str) -> None:
        """Any JSON value, passed through (into ``arguments`` when it is them)."""
        if self._scalar and (char in ",}" or char in _SPACE):
            self._state = "after"
            if char not in _SPACE:
                self.push(char)
            return
        if self._key in self.args_keys:
            self.arguments += char
        if self._in_string:
            if self._escape:
                self._escape = False
            elif char == "\\":
                self._escape = True
            elif char == '"':
                self._in_string = False
                self._state = "after" if self._depth == 0 else "raw"
        elif char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._expect(self._depth > 0)
            self._depth -= 1
            self._state = "after" if self._depth == 0 else "raw"
        elif self._depth == 0:
            self._scalar = True  # a number or a literal, ended by what follows it


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


class ToolCallParser:
    """Splits a reply into content and calls as it arrives (module docstring)."""

    def __init__(self, family: ToolFamily) -> None:
        self.family = family
        self.calls = 0  # calls started so far
        self._buf = ""  # text not yet decided
        self._mode = "start"  # start, text, scan, close, bracket, plain: a method each
        self._call: _CallObject | None = None
        self._raw = ""  # the text of the call being read, for a fallback to content
        self._started = False  # the current call's CallStart was sent
        self._sent_args = 0
        self._after_call = False  # whitespace right after a call is dropped
        self._closer = _HERMES_CLOSE  # what ends the current Hermes call

    def feed(self, text: str) -> list[Delta]:
        self._buf += text
        return self._step(final=False)

    def finish(self) -> list[Delta]:
        out = self._step(final=True)
        if self._mode in ("scan", "bracket") and not self._started:
            out.append(ContentDelta(self._raw + self._buf))  # cut before its name: text
        elif self._mode in ("start", "text", "plain"):
            out.append(ContentDelta(self._buf))
        self._buf = ""
        return _merged(out)

    def _step(self, final: bool) -> list[Delta]:
        out: list[Delta] = []
        try:
            while self._buf:
                before = (self._mode, len(self._buf))
                getattr(self, f"_{self._mode}")(out, final)
                if (self._mode, len(self._buf)) == before:
                    break
        except _Malformed:
            if not self._started:
                out.append(ContentDelta(self._raw))
            if self.family is HERMES and not self._started:  # later calls may still come
                self._mode, self._call, self._raw = "text", None, ""
                out += self._step(final)
            else:
                out.append(ContentDelta(self._buf))
                self._buf, self._mode, self._call, self._raw = "", "plain", None, ""
        return _merged(out)

    def _plain(self, out: list[Delta], final: bool) -> None:
        out.append(ContentDelta(self._buf))
        self._buf = ""

    def _start(self, out: list[Delta], final: bool) -> None:
        """The reply's beginning: Llama 3 calls, and Mistral arrays whose marker did not
        render, can only start here."""
        text = self._buf.lstrip(_SPACE)
        if not text:
            return
        if self.family is LLAMA3:
            if not final and len(text) < len(_PYTHON_TAG) and _PYTHON_TAG.startswith(text):
                return
            if text.startswith(_PYTHON_TAG):
                text = text[len(_PYTHON_TAG):].lstrip(_SPACE)
            if text.startswith("{"):
                self._open_call(text, self._buf[: len(self._buf) - len(text)])
            elif text or final:
                self._mode = "plain"
            return
        if self.family is not HERMES:
            if not final and _MISTRAL_OPEN.startswith(text):
                return
            rest = text[1:].lstrip(_SPACE) if text.startswith("[") else None
            if rest == "" and not final:
                return
            if rest is not None and rest.startswith("{"):
                self._open_call(rest, self._buf[: len(self._buf) - len(rest)])
                return
        self._mode = "text"

    def _text(self, out: list[Delta], final: bool) -> None:
        if self.family is LLAMA3:  # calls come first or not at all
            self._mode = "plain"
            return
        if self._after_call:
            self._buf = self._buf.lstrip(_SPACE)
            self._after_call = not self._buf
            if not self._buf:
                return
        if self.family is HERMES:
            self._hermes_text(out, final)
            return
        marker = _MISTRAL_OPEN
        at = self._buf.find(marker)
        if at >= 0:
            content = self._buf[:at].rstrip(_SPACE)
            out.append(ContentDelta(content))
            markup, rest = self._buf[len(content):at + len(marker)], self._buf[at + len(marker):]
            if self.family is HERMES:
                self._open_call(rest, markup)
            else:
                self._buf, self._mode, self._raw, self._started = rest, "bracket", markup, False
            return
        cut = len(self._buf)
        if not final:  # keep what may start a marker, and the whitespace before it
            cut = len(self._buf[: cut - _partial_suffix(self._buf, marker)].rstrip(_SPACE))
        out.append(ContentDelta(self._buf[:cut]))
        self._buf = self._buf[cut:]

    def _hermes_text(self, out: list[Delta], final: bool) -> None:
        """Content up to a <tool_call> tag or a JSON code block that holds a call."""
        buf = self._buf
        tag, fence = buf.find(_HERMES_OPEN), buf.find(_FENCE)
        wait = None  # where held text starts
        if fence >= 0 and (tag < 0 or fence < tag):
            header = self._fence_header(buf[fence + len(_FENCE):], final)
            if header is None:  # a code block of another kind: content
                out.append(ContentDelta(buf[:fence + len(_FENCE)]))
                self._buf = buf[fence + len(_FENCE):]
                return
            if header >= 0:
                self._begin(out, fence, fence + len(_FENCE) + header, _FENCE)
                return
            wait = fence
        elif tag >= 0:
            self._begin(out, tag, tag + len(_HERMES_OPEN), _HERMES_CLOSE)
            return
        cut = len(buf) if wait is None else wait
        if not final:  # keep what may start a marker, and the whitespace before it
            held = max(_partial_suffix(buf[:cut], m) for m in (_HERMES_OPEN, _FENCE))
            cut = len(buf[: cut - held].rstrip(_SPACE))
        out.append(ContentDelta(buf[:cut]))
        self._buf = buf[cut:]

    def _begin(self, out: list[Delta], at: int, end: int, closer: str) -> None:
        """A Hermes call's markup is ``buf[at:end]``: the content before it is certain."""
        content = self._buf[:at].rstrip(_SPACE)
        out.append(ContentDelta(content))
        self._closer = closer
        self._open_call(self._buf[end:], self._buf[len(content):end])
        if closer == _FENCE and self._call is not None:
            self._call.first_keys = ("name",)

    @staticmethod
    def _fence_header(rest: str, final: bool) -> int | None:
        """After ```: the length of a json/xml header that a call object follows, None when
        this is not a call's block, -1 when the text so far cannot tell."""
        match = _FENCE_HEADER.match(rest)
        if match is None:
            return -1 if not final and _FENCE_PARTIAL.fullmatch(rest) else None
        after = rest[match.end():]
        if not after:
            return -1 if not final else None
        return match.end() if after.startswith("{") else None

    def _bracket(self, out: list[Delta], final: bool) -> None:
        """Mistral, after [TOOL_CALLS]: the array's '['."""
        text = self._buf.lstrip(_SPACE)
        if text:
            _CallObject._expect(text.startswith("["))
            self._open_call(text[1:], self._raw + self._buf[: len(self._buf) - len(text) + 1])

    def _open_call(self, rest: str, markup: str) -> None:
        """A call object starts in ``rest``; ``markup``: the text before it that belongs to
        it (content again if it is not a call)."""
        if self.family is LLAMA3:
            self._call = _CallObject(("parameters", "arguments"),
                                     ("name", "type", "parameters", "arguments"))
        else:
            first = ("name", "arguments", "id") if self.family is not HERMES else None
            self._call = _CallObject(("arguments",), first)
        self._buf, self._mode, self._raw = rest, "scan", markup
        self._started, self._sent_args = False, 0

    def _scan(self, out: list[Delta], final: bool) -> None:
        call = self._call
        assert call is not None
        used = 0
        for char in self._buf:
            call.push(char)
            used += 1
            if call.done:
                break
        self._raw += self._buf[:used]
        self._buf = self._buf[used:]
        if call.name is not None and not self._started:
            out.append(CallStart(self.calls, call.name))
            self._started = True
            self.calls += 1
        if self._started and len(call.arguments) > self._sent_args:
            out.append(ArgumentsDelta(self.calls - 1, call.arguments[self._sent_args:]))
            self._sent_args = len(call.arguments)
        if call.done:
            self._mode, self._call = "close", None

    def _close(self, out: list[Delta], final: bool) -> None:
        """After a call object: the family's closing syntax."""
        text = self._buf.lstrip(_SPACE)
        if self.family is HERMES:
            if text.startswith(self._closer):
                text = text[len(self._closer):]
            elif self._closer.startswith(text):  # a close tag not (yet, or ever) whole
                if not final:
                    self._buf = text
                    return
                text = ""
            # (a missing close tag is forgiven)
            self._buf, self._mode, self._after_call = text, "text", True
            return
        if not text:
            self._buf = text
            return
        self._raw = ""
        if self.family is LLAMA3:
            if text.startswith(";"):
                self._open_call(text[1:], "")
            else:
                self._buf, self._mode = text, "plain"
        elif text.startswith(","):
            self._open_call(text[1:], "")
        else:
            _CallObject._expect(text.startswith("]"))
            self._buf, self._mode, self._after_call = text[1:], "text", True


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a start of ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def _merged(deltas: list[Delta]) -> list[Delta]:
    """Adjacent content (or one call's argument fragments) joined; empty content dropped."""
    out: list[Delta] = []
    for delta in deltas:
        if isinstance(delta, ContentDelta) and not delta.text:
            continue
        last = out[-1] if out else None
        if isinstance(delta, ContentDelta) and isinstance(last, ContentDelta):
            out[-1] = ContentDelta(last.text + delta.text)
        elif (isinstance(delta, ArgumentsDelta) and isinstance(last, ArgumentsDelta)
              and last.index == delta.index):
            out[-1] = ArgumentsDelta(delta.index, last.text + delta.text)
        else:
            out.append(delta)
    return out


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str


def parse_reply(family: ToolFamily, text: str) -> tuple[str | None, list[ParsedCall]]:
    """A whole reply: its content (None when empty and there are calls) and its calls."""
    parser = ToolCallParser(family)
    deltas = parser.feed(text) + parser.finish()
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    names = [d.name for d in deltas if isinstance(d, CallStart)]
    arguments = ["" for _ in names]
    for delta in deltas:
        if isinstance(delta, ArgumentsDelta):
            arguments[delta.index] += delta.text
    calls = [ParsedCall(n, a) for n, a in zip(names, arguments, strict=True)]
    return (content or None) if calls else content, calls
