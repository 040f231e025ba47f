"""Request and response bodies of the OpenAI-compatible API (pydantic v2).

Requests forbid unknown fields: a parameter localspec does not implement is a 400 naming it,
never silently ignored. Fields OpenAI defines that localspec accepts only at their neutral
value (``n=1``, no ``logit_bias``, ...) are declared and checked in ``check_supported``.
Extensions: ``top_k``, ``min_p``, ``draft_max``, ``speculative``, llama.cpp's
``repeat_penalty``, ``repeat_last_n`` and ``grammar``, and the ``localspec`` options object
(see docs/server.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from localspec.errors import InvalidParameterError
from localspec.server.tools import Tool, ToolCallIn, ToolChoice, check_tool_request


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: bool = False


class LocalspecOptions(Strict):
    """The ``localspec`` request extension object."""

    provenance: bool = False  # per-token draft/target provenance in the response


class JsonSchemaFormat(BaseModel):
    """OpenAI's ``response_format.json_schema``: a named schema (``strict`` is always on)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")  # e.g. "name", "refusal": harmless metadata

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant's calls (server/tools.py)
    tool_call_id: str | None = None  # a tool result: the call it answers
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        if isinstance(value, list):
            for part in value:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                if kind != "text":
                    raise ValueError(f"only text content parts are supported, not {kind!r}")
        return value

    @property
    def template_role(self) -> str:
        """OpenAI's ``developer`` role is a system message to a chat template."""
        return "system" if self.role == "developer" else self.role

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class Prediction(Strict):
    """OpenAI's Predicted Outputs: ``{"type": "content", "content": TEXT or [text parts]}``."""

    type: Literal["content"]
    content: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class SamplingRequest(Strict):
    """Fields shared by both completion endpoints."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    prediction: Prediction | None = None  # Predicted Outputs (a drafter; output unchanged)
    user: str | None = None  # an end-user id; recorded nowhere, accepted for compatibility
    # extensions
    top_k: int | None = None
    min_p: float | None = None
    draft_max: int | str | None = None  # an int or "auto" (checked with the other values)
    speculative: bool | None = None
    exact: bool | None = None  # require the server's exact mode (400 when it runs without)
    ignore_eos: bool | None = None
    repeat_penalty: float | None = None  # llama.cpp's server names
    repeat_last_n: int | None = None
    cache_prompt: bool | None = None  # llama.cpp's name: reuse the cached prefix (default true)
    grammar: str | None = None  # GBNF, as llama.cpp's server accepts
    localspec: LocalspecOptions | None = None

    @field_validator("max_tokens", "temperature", "top_p", "seed", "n", "presence_penalty",
                     "frequency_penalty", "top_k", "min_p", "draft_max", "repeat_penalty",
                     "repeat_last_n", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any) -> Any:
        # pydantic's lax mode reads true as 1: a client's mistake, not a number.
        if isinstance(value, bool):
            raise ValueError("a number is needed here, not true or false")
        return value

    def check_supported(self) -> None:
        """Raise InvalidParameterError for OpenAI features localspec does not implement."""
        if self.n not in (None, 1):
            raise _unsupported("n", "only n=1 is supported; send several requests instead")
        if self.logit_bias:
            raise _unsupported("logit_bias", "logit_bias is not implemented")
        if self.stream_options is not None and not self.stream:
            raise _unsupported("stream_options", "stream_options is only allowed with stream=true")
        fmt = self.response_format
        if fmt is not None and fmt.type != "text" and self.grammar is not None:
            raise _unsupported("grammar", "send either a grammar or a response_format, not both")
        if fmt is not None and fmt.type == "json_schema" and (
            fmt.json_schema is None or fmt.json_schema.json_schema is None
        ):
            raise _unsupported(
                "response_format", "type 'json_schema' needs json_schema.schema (a JSON Schema)"
            )

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def want_provenance(self) -> bool:
        return self.localspec is not None and self.localspec.provenance


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    functions: list[Any] | None = None  # OpenAI's deprecated form of tools: refused by name
    function_call: Any = None

    def check_supported(self) -> None:
        super().check_supported()
        for legacy in ("functions", "function_call"):
            if getattr(self, legacy) is not None:
                raise _unsupported(legacy, f"{legacy} is OpenAI's deprecated form of tool "
                                   "calls; send tools (and tool_choice) instead")
        check_tool_request(self.tools, self.tool_choice)
        forcing = self.tools and self.tool_choice not in (None, "auto", "none")
        if forcing and (self.grammar is not None or (
                self.response_format is not None and self.response_format.type != "text")):
            raise _unsupported("tool_choice", "a required or named tool call already shapes "
                               "the reply; send no grammar or response_format with it")
        if self.top_logprobs is not None and not self.logprobs:
            raise _unsupported("top_logprobs", "top_logprobs needs logprobs=true")
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise _unsupported("max_tokens", "max_tokens and max_completion_tokens disagree")

    def token_limit(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int]
    echo: bool | None = None
    best_of: int | None = None
    logprobs: int | None = None
    suffix: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise _unsupported("prompt", "only one prompt per request is supported")
        if isinstance(self.prompt, list) and not self.prompt:
            raise _unsupported("prompt", "the prompt is empty")
        if self.echo:
            raise _unsupported("echo", "echo is not implemented")
        if self.best_of not in (None, 1):
            raise _unsupported("best_of", "only best_of=1 is supported")
        if self.suffix is not None and not isinstance(self.prompt_value(), str):
            raise _unsupported("suffix", "a suffix (fill-in-the-middle) needs a text prompt, "
                               "not token ids")

    def prompt_value(self) -> str | list[int]:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            return str(self.prompt[0])
        return self.prompt  # type: ignore[return-value]

    def token_limit(self) -> int | None:
        return self.max_tokens


class InfillChunk(BaseModel):
    """One ``input_extra`` entry of ``/infill``: other keys (llama.vscode sends ``time``) are
    ignored, as llama.cpp's server does."""

    model_config = ConfigDict(extra="ignore")

    text: str
    filename: str = "tmp"  # llama.cpp's default name


_EXTRA_SHAPE = "it must be a list of {\"filename\": string, \"text\": string} objects"


class InfillRequest(SamplingRequest):
    """llama.cpp server's ``POST /infill`` (docs/server.md, "Coding assistants"): the sampling
    fields of the completion endpoints (``n_predict`` for ``max_tokens``) plus its FIM fields."""

    model: str = ""  # optional here: llama.cpp's clients send it only when configured
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[InfillChunk] = Field(default_factory=list)
    prompt: str = ""  # typed after the prefix, before the cursor
    n_predict: int | None = None  # -1: the server's cap; 0: only prefill (warm the cache)
    n_indent: int = 0  # stop at a line indented less than this (0: off)
    t_max_predict_ms: int = 0  # stop at a newline once generating took this long (<= 0: off)
    return_tokens: bool = False
    # Accepted for llama.vscode, not honoured (docs/server.md says why): one completion comes
    # back whatever n_cmpl, localspec's sampler chain is fixed, slots are not pinned, and
    # llama.cpp does not implement t_max_prompt_ms either.
    n_cmpl: int | None = None
    samplers: list[str] | None = None
    id_slot: int | None = None
    t_max_prompt_ms: int | None = None

    @field_validator("input_extra", mode="before")
    @classmethod
    def _chunks(cls, value: Any) -> Any:
        if value is None:
            return []
        if not isinstance(value, list) or not all(
            isinstance(c, dict) and isinstance(c.get("text"), str)
            and isinstance(c.get("filename", ""), str) for c in value
        ):
            raise ValueError(_EXTRA_SHAPE)
        return value

    @field_validator("n_predict", "n_indent", "t_max_predict_ms", "n_cmpl", "id_slot",
                     "t_max_prompt_ms", mode="before")
    @classmethod
    def _integers(cls, value: Any) -> Any:
        if isinstance(value, bool) or (value is not None and not isinstance(value, int)):
            raise ValueError("an integer is needed here")
        return value

    def check_supported(self) -> None:
        super().check_supported()
        if self.n_predict is not None and self.n_predict < -1:
            raise _unsupported("n_predict", "it must be -1 (up to the server's cap), 0 (only "
                               "prefill) or a positive number of tokens")
        if self.n_indent < 0:
            raise _unsupported("n_indent", "it must be 0 (off) or a positive indentation")
        if self.n_cmpl is not None and self.n_cmpl < 1:
            raise _unsupported("n_cmpl", "it must be at least 1")

    def token_limit(self) -> int | None:
        """n_predict wins over max_tokens (llama.cpp); -1 and 0 mean the server's cap."""
        if self.n_predict is not None:
            return None if self.n_predict <= 0 else self.n_predict
        return self.max_tokens


def _unsupported(param: str, reason: str) -> InvalidParameterError:
    error = InvalidParameterError(f"Unsupported value for '{param}': {reason}.")
    error.param = param  # type: ignore[attr-defined]
    return error


# ---- responses ----------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens reused from the cache (OpenAI's name)


class CompletionTokensDetails(BaseModel):
    """OpenAI's names. Predicted Outputs: prediction tokens drafted and accepted, and drafted
    and rejected by verification (never drafted: in neither)."""

    reasoning_tokens: int = 0
    accepted_prediction_tokens: int
    rejected_prediction_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails


class TokenProvenance(BaseModel):
    id: int
    text: str
    source: Literal["draft", "target"]


class SpeculationStats(BaseModel):
    """The ``localspec`` extension object on every response and on the final stream chunk."""

    drafter: str
    speculative: bool
    exact: bool  # the server's mode (docs/exact.md)
    drafted: int
    accepted: int
    rejected: int
    acceptance_rate: float
    mean_accepted_length: float
    tokens_per_second: float
    prefill_tokens_per_second: float
    time_to_first_token: float
    generation_seconds: float
    last_drafted: int
    drafted_by_kind: dict[str, int]
    accepted_by_kind: dict[str, int]
    provenance: list[TokenProvenance] | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "localspec"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


def dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(exclude_none=True)
