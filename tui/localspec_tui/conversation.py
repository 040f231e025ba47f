"""The conversation so far and the prompt it becomes through the model's chat template.

Rendering and trimming are the shared ``localspec.text.chat_template`` code (the server uses the
same); this module only decides the budget: the prompt may use the context minus the room
reserved for the reply, and the oldest turns go first when it does not fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from localspec.errors import PromptTooLongError
from localspec.text.chat_template import (
    ChatFormat,
    chat_format,
    chat_tokens,
    fit_history,
    render_chat,
)
from localspec.types import EngineInfo

Tokenize = Callable[[str, bool, bool], list[int]]  # (text, add_special, parse_special)
MIN_REPLY_TOKENS = 16


@dataclass
class PreparedPrompt:
    tokens: list[int]
    dropped: int  # messages removed from the start of the history to fit the context
    max_tokens: int  # room left for the reply


@dataclass
class Conversation:
    system_prompt: str | None = None
    template: str | None = None  # overrides the GGUF's chat template
    stop: tuple[str, ...] = ()  # strings that end a reply under that template
    messages: list[dict[str, str]] = field(default_factory=list)

    def history(self) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + self.messages

    def add(self, role: str, content: str) -> None:
        self.messages.append({"role": role, "content": content})

    def clear(self) -> None:
        self.messages.clear()

    def format_for(self, info: EngineInfo) -> ChatFormat:
        return chat_format(info.chat_template, self.template, self.stop)

    def template_for(self, info: EngineInfo) -> str:
        return self.format_for(info).template

    def stop_strings(self, info: EngineInfo) -> tuple[str, ...]:
        return self.format_for(info).stop

    def render(self, info: EngineInfo, messages: list[dict[str, str]]) -> str:
        return render_chat(
            self.template_for(info),
            messages,
            bos_token=info.bos_text,
            eos_token=info.eos_text,
            add_generation_prompt=True,
        )

    def prepare(self, info: EngineInfo, tokenize: Tokenize, max_tokens: int) -> PreparedPrompt:
        """Tokens of the prompt for the next reply, trimming the oldest turns if needed.

        Trimmed turns are removed from the conversation for good, so the transcript notice
        and what the model sees agree. Raises PromptTooLongError when even the last message
        (with the system prompt) leaves no room for a reply.
        """
        reserve = max(MIN_REPLY_TOKENS, min(max_tokens, info.n_ctx // 2))
        budget = info.n_ctx - reserve

        def encode(messages: list[dict[str, str]]) -> list[int]:
            return chat_tokens(self.template_for(info), messages, info, tokenize)

        kept, dropped = fit_history(self.history(), lambda m: len(encode(m)), budget)
        if dropped:
            self.messages = [m for m in kept if m.get("role") != "system"]
        tokens = encode(kept)
        room = info.n_ctx - len(tokens)
        if room < MIN_REPLY_TOKENS:
            raise PromptTooLongError(
                f"This message needs {len(tokens)} tokens but the context holds {info.n_ctx}; "
                "shorten it or restart with a larger --ctx."
            )
        return PreparedPrompt(tokens, dropped, min(max_tokens, room))
