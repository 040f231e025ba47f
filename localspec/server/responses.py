"""Response bodies and stream chunks in OpenAI's shapes, plus the ``localspec`` extension."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from localspec.server.schemas import (
    CompletionTokensDetails,
    PromptTokensDetails,
    SpeculationStats,
    TokenProvenance,
    Usage,
)
from localspec.server.tools import ToolReply
from localspec.types import GenerationResult, GenerationStats, Provenance

Kind = Literal["chat", "completion"]


def usage_of(result: GenerationResult, prompt_tokens: int) -> dict[str, Any]:
    """completion_tokens: the tokens whose text the client receives (not those a stop string
    cut)."""
    stats = result.stats
    prompt = stats.prompt_tokens or prompt_tokens
    completion = result.completion_tokens
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=stats.cached_prompt_tokens),
        completion_tokens_details=CompletionTokensDetails(
            accepted_prediction_tokens=stats.accepted_prediction_tokens,
            rejected_prediction_tokens=stats.rejected_prediction_tokens),
    ).model_dump()


def speculation_of(
    stats: GenerationStats, drafter: str, speculative: bool, exact: bool = False
) -> dict[str, Any]:
    return SpeculationStats(
        drafter=drafter,
        speculative=speculative,
        exact=exact,
        drafted=stats.drafted,
        accepted=stats.accepted,
        rejected=stats.rejected,
        acceptance_rate=stats.acceptance_rate,
        mean_accepted_length=stats.mean_accepted_length,
        tokens_per_second=stats.tokens_per_second,
        prefill_tokens_per_second=stats.prefill_tokens_per_second,
        time_to_first_token=stats.time_to_first_token,
        generation_seconds=stats.generation_seconds,
        last_drafted=stats.last_drafted,
        drafted_by_kind=stats.drafted_by_kind,
        accepted_by_kind=stats.accepted_by_kind,
    ).model_dump(exclude_none=True)


def provenance_of(
    tokens: Sequence[int], sources: Sequence[Provenance], token_text: Callable[[int], str]
) -> list[dict[str, Any]]:
    return [
        TokenProvenance(id=t, text=token_text(t), source=s).model_dump()
        for t, s in zip(tokens, sources, strict=True)
    ]


def finish_reason_of(reason: str) -> str:
    return "stop" if reason == "cancelled" else reason


@dataclass
class Shape:
    """Builds the bodies of one response (one id, one creation time)."""

    kind: Kind
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        prefix = "chatcmpl" if self.kind == "chat" else "cmpl"
        self.id = self.id or f"{prefix}-{uuid.uuid4().hex}"

    def _envelope(self, stream: bool) -> dict[str, Any]:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if stream else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(
        self, result: GenerationResult, usage: dict[str, int], extension: dict[str, Any],
        logprobs: dict[str, Any] | None = None,
        tools: ToolReply | None = None,
    ) -> dict[str, Any]:
        """``tools``: the reply read for tool calls (its message and finish reason)."""
        reason = finish_reason_of(result.finish_reason)
        choice: dict[str, Any] = {
            "index": 0,
            "finish_reason": tools.finish_reason(reason) if tools else reason,
            "logprobs": logprobs,
        }
        if self.kind == "chat":
            choice["message"] = (tools.message() if tools
                                 else {"role": "assistant", "content": result.text})
        else:
            choice["text"] = result.text
        body = {**self._envelope(False), "choices": [choice], "usage": usage}
        return {**body, "localspec": extension}

    def chunk(
        self,
        text: str,
        *,
        role: bool = False,
        finish_reason: str | None = None,
        extension: dict[str, Any] | None = None,
        with_usage_field: bool = False,
        logprobs: dict[str, Any] | None = None,
        delta: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``delta``: a chat delta to send instead of ``text`` (a tool call's part)."""
        choice: dict[str, Any] = {
            "index": 0, "finish_reason": finish_reason, "logprobs": logprobs,
        }
        if self.kind == "chat":
            if delta is None:
                delta = {"role": "assistant"} if role else {}
                if text or role:
                    delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text
        body = {**self._envelope(True), "choices": [choice]}
        if with_usage_field:
            body["usage"] = None
        if extension is not None:
            body["localspec"] = extension
        return body

    def usage_chunk(self, usage: dict[str, int], extension: dict[str, Any]) -> dict[str, Any]:
        return {**self._envelope(True), "choices": [], "usage": usage, "localspec": extension}
