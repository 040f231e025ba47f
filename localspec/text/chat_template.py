"""Chat templates: render a GGUF ``tokenizer.chat_template`` the way transformers does.

The template is Jinja2 run in a sandbox with ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension, a ``tojson`` filter that keeps non-ASCII text, and the globals
``raise_exception`` and ``strftime_now`` that Hugging Face templates call. A model without a
template gets ChatML (``<|im_start|>role ... <|im_end|>``).

``fit_history`` trims a conversation to a token budget by dropping the oldest non-system turns;
the server does not trim (a prompt over the context is an error there), the chat UI does.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localspec.errors import LocalspecError
from localspec.types import EngineInfo

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplateError(LocalspecError):
    """The chat template refused the conversation or is not valid Jinja2."""


# Without a template in the GGUF we render ChatML; a model that does not know ChatML has no
# end-of-turn token for it, so a reply ends on the markers as text.
CHATML_STOPS = ("<|im_end|>", "<|im_start|>")


@dataclass(frozen=True)
class ChatFormat:
    """How a conversation becomes a prompt, and which strings end the model's reply."""

    template: str
    stop: tuple[str, ...]


def chat_format(gguf_template: str | None, override: str | None = None,
                stop: Sequence[str] = ()) -> ChatFormat:
    """The template to use (an override from models.toml or the user, else the GGUF's, else
    ChatML) and the reply's stop strings (`stop` from models.toml, plus ChatML's markers)."""
    if override:
        return ChatFormat(override, tuple(stop))
    if gguf_template:
        return ChatFormat(gguf_template, tuple(stop))
    return ChatFormat(CHATML_TEMPLATE, tuple(dict.fromkeys((*CHATML_STOPS, *stop))))


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"The model's chat template refused the conversation: {message}")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:  # noqa: A002 - the name templates use
    return datetime.now().strftime(format)


# A template is data from a model file or a user: bounded in the work one render may do (lines
# of template code run) and in the size of what its '*' and '**' may build.
RENDER_LINE_BUDGET = 1_000_000
MAX_PRODUCT = 1_000_000


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, whose '*' and '**' cannot build a value of a billion items."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(right, int) and abs(right) > 64:
            raise ChatTemplateError("The chat template raises a number to too large a power.")
        if operator == "*":
            for value, count in ((left, right), (right, left)):
                if (isinstance(value, (str, list, tuple)) and isinstance(count, int)
                        and len(value) * count > MAX_PRODUCT):
                    raise ChatTemplateError("The chat template repeats a value into more than "
                                            f"{MAX_PRODUCT} items.")
        return super().call_binop(context, operator, left, right)


class _LineBudget:
    """sys.settrace hooks that count the lines of template code a render runs (the compiled
    template's own frames only: library code is not traced) and stop it past the budget."""

    def __init__(self, lines: int) -> None:
        self.left = lines

    def on_call(self, frame: Any, event: str, arg: Any) -> Any:
        return self.on_line if frame.f_code.co_filename == "<template>" else None

    def on_line(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            self.left -= 1
            if self.left < 0:
                raise ChatTemplateError(
                    "The chat template runs too long for this conversation (more than "
                    f"{RENDER_LINE_BUDGET} steps); it loops without end or far too often.")
        return self.on_line


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = _BoundedSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateError as error:
        raise ChatTemplateError(f"The chat template is not valid Jinja2: {error}") from error


def render_chat(
    template: str,
    messages: list[dict],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """Render ``messages`` (dicts with ``role`` and ``content``) into one prompt string.

    ``template`` may be empty (or None): ChatML is used then. The result already contains the
    BOS text when the template writes ``bos_token``; tokenize it without adding specials again.
    ``tools``: OpenAI's tool list, which templates that know tools render (as transformers
    passes it).
    """
    compiled = _compile(template or CHATML_TEMPLATE)
    previous = sys.gettrace()
    sys.settrace(_LineBudget(RENDER_LINE_BUDGET).on_call)
    try:
        return compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            tools=tools,
        )
    except ChatTemplateError:
        raise
    except (jinja2.TemplateError, OverflowError, RecursionError, MemoryError) as error:
        raise ChatTemplateError(f"The chat template failed to render: "
                                f"{str(error)[:200]}") from error
    finally:
        sys.settrace(previous)


def chat_tokens(
    template: str,
    messages: list[dict],
    info: EngineInfo,
    tokenize: Callable[[str, bool, bool], list[int]],
) -> list[int]:
    """``messages`` rendered for a reply and tokenized with special tokens parsed; BOS is added
    unless the template already wrote it. ``tokenize(text, add_special, parse_special)``."""
    text = render_chat(template, messages, bos_token=info.bos_text, eos_token=info.eos_text)
    return rendered_tokens(text, info, tokenize)


def rendered_tokens(
    text: str,
    info: EngineInfo,
    tokenize: Callable[[str, bool, bool], list[int]],
) -> list[int]:
    """A rendered chat (render_chat) tokenized as chat_tokens does, for a caller that keeps
    the text too."""
    add_bos = not (info.bos_text and text.startswith(info.bos_text))
    return tokenize(text, add_bos, True)


def fit_history(
    messages: Sequence[dict],
    count_tokens: Callable[[list[dict]], int],
    budget: int,
) -> tuple[list[dict], int]:
    """Drop the oldest non-system messages until ``count_tokens(messages) <= budget``.

    ``count_tokens`` receives a candidate message list and returns the token count of its
    rendered prompt (so template overhead counts). System messages and the last message are
    never dropped; after a drop, leading non-user messages (an orphaned assistant reply or tool
    result) are dropped too, so the kept history starts with a user turn. Returns the kept
    messages and how many were dropped; the result may still exceed the budget when only the
    system messages and the last message remain (the caller decides what to do then).
    """
    kept = list(messages)
    dropped = 0
    while count_tokens(kept) > budget:
        index = _oldest_droppable(kept)
        if index is None:
            break
        del kept[index]
        dropped += 1
        while (index := _oldest_droppable(kept)) is not None and kept[index].get("role") != "user":
            del kept[index]
            dropped += 1
    return kept, dropped


def _oldest_droppable(messages: list[dict]) -> int | None:
    """Index of the first non-system message that is not the last message, if any."""
    for index, message in enumerate(messages[:-1]):
        if message.get("role") != "system":
            return index
    return None
