"""Turn a validated request into prompt tokens and GenerationParams for the engine.

Runs on worker threads (tokenizing releases the GIL in C++). A prompt whose byte size alone
shows that it cannot fit the context is refused before it is tokenized.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields, replace
from typing import Any

from localspec.errors import InvalidParameterError, PromptTooLongError
from localspec.runtime.engine import Engine
from localspec.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    InfillRequest,
    SamplingRequest,
)
from localspec.server.tools import ToolPlan, plan_tools, template_message
from localspec.text.chat_template import chat_format, render_chat
from localspec.text.fim import (
    ExtraChunk,
    FimInput,
    FimTokens,
    find_fim_tokens,
    missing_fim_error,
    model_fim_prompt,
    special_prefix,
)
from localspec.text.grammar import JSON_OBJECT_GBNF, json_schema_to_gbnf
from localspec.text.grammar_check import DEFAULT_LIMITS, GrammarLimits
from localspec.text.tool_calls import family_of
from localspec.types import GenerationParams

# Request fields copied onto GenerationParams when the client sets them.
_SAMPLING_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "seed", "draft_max", "speculative", "ignore_eos",
    "repeat_penalty", "frequency_penalty", "presence_penalty", "exact",
)


@dataclass(frozen=True)
class Prepared:
    tokens: list[int]
    params: GenerationParams
    provenance: bool
    prompt_text: str = ""  # the prompt as text, for responses that echo it (/infill)
    tools: ToolPlan | None = None  # a reply to read for tool calls (server/tools.py)


class Preparer:
    """Knows the model's template, specials and context; safe to call from worker threads.
    ``max_tokens``: the server's default and cap of a request's generated tokens."""

    def __init__(
        self,
        engine: Engine,
        chat_template: str | None,
        defaults: GenerationParams,
        max_tokens: int,
        grammar_limits: GrammarLimits = DEFAULT_LIMITS,
    ) -> None:
        self._engine = engine
        self._format = chat_format(engine.info.chat_template, chat_template, defaults.stop)
        self._defaults = replace(defaults, stop=())
        self._bos_prefix = special_prefix(engine)
        self._max_tokens = max_tokens
        self._grammar_limits = grammar_limits
        self._max_prompt_bytes = engine.info.n_ctx * _max_token_bytes(engine)
        self._fim: FimTokens | None = None
        self._fim_looked_up = False
        self._fim_lock = threading.Lock()

    def tokenize(self, text: str, *, chat: bool) -> list[int]:
        size = len(text.encode("utf-8"))
        if size > self._max_prompt_bytes:
            raise PromptTooLongError(
                f"The prompt is {size} bytes, more than any prompt that fits the context of "
                f"{self._engine.info.n_ctx} tokens can be; shorten it or restart the server "
                "with a larger --ctx.", param="messages" if chat else "prompt",
            )
        if chat:
            return self._engine.tokenize(text, add_special=False, parse_special=True)
        return self._engine.tokenize(text)

    def chat(self, request: ChatCompletionRequest) -> Prepared:
        request.check_supported()
        self._check_conversation_size(request)
        plan = plan_tools(request.tools, request.tool_choice, request.parallel_tool_calls,
                          self._format.template)
        tokens = self.tokenize(self.render(request, plan), chat=True)
        if self._bos_prefix and tokens[: len(self._bos_prefix)] != self._bos_prefix:
            tokens = self._bos_prefix + tokens
        prepared = self._prepared(request, tokens, request.token_limit(), self._format.stop,
                                  plan.grammar if plan else None)
        return replace(prepared, tools=plan)

    def _check_conversation_size(self, request: ChatCompletionRequest) -> None:
        """Before the template renders it (Python, under the GIL): a conversation with more
        messages than the context has tokens, or more text than any fitting prompt, cannot fit
        (one of 20,000 short turns held the server's preparation for seconds)."""
        n_ctx = self._engine.info.n_ctx
        if len(request.messages) > n_ctx:
            raise PromptTooLongError(
                f"The conversation has {len(request.messages)} messages, more than the context "
                f"of {n_ctx} tokens can hold; send fewer or restart the server with a larger "
                "--ctx.", param="messages")
        size = sum(len(m.text().encode("utf-8")) for m in request.messages)
        if size > self._max_prompt_bytes:
            raise PromptTooLongError(
                f"The messages hold {size} bytes of text, more than any prompt that fits the "
                f"context of {n_ctx} tokens can be; shorten them or restart the server with a "
                "larger --ctx.", param="messages")

    def render(self, request: ChatCompletionRequest, plan: ToolPlan | None = None) -> str:
        family = plan.family if plan else family_of(self._format.template)
        messages = [template_message(m, i, family) for i, m in enumerate(request.messages)]
        info = self._engine.info
        return render_chat(
            self._format.template, messages, bos_token=info.bos_text, eos_token=info.eos_text,
            tools=plan.template_tools if plan else None,
        )

    def completion(self, request: CompletionRequest) -> Prepared:
        request.check_supported()
        prompt = request.prompt_value()
        if request.suffix is not None:  # OpenAI's fill-in-the-middle: prompt, gap, suffix
            assert isinstance(prompt, str)  # check_supported
            return self._fill(request, FimInput(prompt, request.suffix), "suffix",
                              request.token_limit())
        tokens = self.tokenize(prompt, chat=False) if isinstance(prompt, str) else list(prompt)
        if not tokens:
            raise InvalidParameterError("The prompt is empty; send some text.")
        n_vocab = self._engine.info.n_vocab
        if any(not 0 <= t < n_vocab for t in tokens):
            raise InvalidParameterError(
                f"prompt=[...] is invalid: token ids must be in [0, {n_vocab})."
            )
        return self._prepared(request, tokens, request.token_limit())

    def infill(self, request: InfillRequest) -> Prepared:
        """llama.cpp's /infill: extra chunks, prefix, typed prompt, suffix (localspec.text.fim).
        ``n_predict=0`` only prefills the prompt (one token is generated, and not sent)."""
        request.check_supported()
        limit = 1 if request.n_predict == 0 else request.token_limit()
        extra = tuple(ExtraChunk(c.filename, c.text) for c in request.input_extra)
        fill = FimInput(request.input_prefix, request.input_suffix, request.prompt, extra)
        return self._fill(request, fill, "input_prefix", limit)

    def _fill(self, request: SamplingRequest, fill: FimInput, param: str,
              max_tokens: int | None) -> Prepared:
        size = fill.text_bytes()
        if size > 4 * self._max_prompt_bytes:  # trimming keeps the ends; this much is abuse
            raise PromptTooLongError(
                f"The fill-in-the-middle text is {size} bytes, far more than the context of "
                f"{self._engine.info.n_ctx} tokens can use; send less of the file.", param=param)
        fim = self.fim_tokens()
        if fim is None:
            raise missing_fim_error(param)
        n_predict = min(max_tokens or self._max_tokens, self._max_tokens)
        built = model_fim_prompt(self._engine, fill, n_predict, fim=fim)
        prepared = self._prepared(request, built.tokens, max_tokens)
        return replace(prepared, prompt_text=self._engine.detokenize(built.tokens))

    def fim_tokens(self) -> FimTokens | None:
        """The model's FIM tokens, looked up in its vocabulary once (on the first FIM request's
        worker thread: a whole-vocabulary scan)."""
        with self._fim_lock:
            if not self._fim_looked_up:
                self._fim = find_fim_tokens(self._engine.info.n_vocab, self._engine.token_text)
                self._fim_looked_up = True
            return self._fim

    def _prepared(
        self, request: SamplingRequest, tokens: list[int], max_tokens: int | None,
        template_stop: tuple[str, ...] = (), tool_grammar: str | None = None,
    ) -> Prepared:
        n_ctx = self._engine.info.n_ctx
        room = n_ctx - len(tokens)
        if room <= 0:
            raise PromptTooLongError(
                f"The prompt has {len(tokens)} tokens but the context holds {n_ctx}; "
                "shorten it or restart the server with a larger --ctx.",
                param="messages" if isinstance(request, ChatCompletionRequest) else "prompt",
            )
        params = replace(self._defaults, **_overrides(request))
        if tool_grammar is not None:
            params = replace(params, grammar=tool_grammar)
        if params.grammar is not None:
            self._check_grammar(request, params.grammar, tool_grammar is not None)
        limit = min(max_tokens, self._max_tokens) if max_tokens is not None else self._max_tokens
        stop = tuple(dict.fromkeys((*template_stop, *request.stop_strings())))
        params = replace(params, max_tokens=min(limit, room), stop=stop)
        if request.prediction is not None:  # tokenized here, on this worker thread
            params = replace(params, prediction=tuple(self._prediction(request.prediction.text())))
        params.validate()
        return Prepared(tokens, params, request.want_provenance)


    def _prediction(self, text: str) -> list[int]:
        size = len(text.encode("utf-8"))
        if size > self._max_prompt_bytes:
            raise InvalidParameterError(
                f"prediction is {size} bytes, more than any text that fits the context of "
                f"{self._engine.info.n_ctx} tokens can be; send a shorter one.", param="prediction")
        return self._engine.prediction_tokens(text)

    def _check_grammar(self, request: SamplingRequest, grammar: str, tools: bool) -> None:
        """localspec's own check and limits first (llama.cpp's parser then never meets a
        grammar it would refuse, echo or expand without bound), then llama.cpp's."""
        param = "tools" if tools else (
            "grammar" if request.grammar is not None else "response_format")
        self._engine.check_grammar(grammar, self._grammar_limits, param)


def _overrides(request: SamplingRequest) -> dict[str, Any]:
    names = {f.name for f in fields(GenerationParams)}
    out: dict[str, Any] = {}
    for name in _SAMPLING_FIELDS:
        value = getattr(request, name)
        if value is not None and name in names:
            out[name] = value
    if request.repeat_last_n is not None:
        out["penalty_last_n"] = request.repeat_last_n
    if request.cache_prompt is not None:
        out["reuse_cache"] = request.cache_prompt
    grammar = _grammar(request)
    if grammar is not None:
        out["grammar"] = grammar
    return {**out, **_logprobs(request)}


def _grammar(request: SamplingRequest) -> str | None:
    fmt = request.response_format
    if fmt is None or fmt.type == "text":
        return request.grammar
    if fmt.type == "json_object":
        return JSON_OBJECT_GBNF
    assert fmt.json_schema is not None  # check_supported
    try:
        return json_schema_to_gbnf(fmt.json_schema.json_schema)
    except InvalidParameterError as error:
        error.param = "response_format"  # type: ignore[attr-defined]
        raise


def _logprobs(request: SamplingRequest) -> dict[str, Any]:
    if isinstance(request, ChatCompletionRequest) and request.logprobs:
        return {"logprobs": True, "top_logprobs": request.top_logprobs or 0}
    if isinstance(request, CompletionRequest) and request.logprobs is not None:
        return {"logprobs": True, "top_logprobs": request.logprobs}
    return {}


def _max_token_bytes(engine: Engine) -> int:
    """An upper bound on the prompt bytes one token can stand for: its vocabulary text is at
    least as long as the bytes it matches ("Ġ" or "▁" for a space, "<0x0A>" for a byte), with a
    factor of 4 for tokenizers that normalize text before matching."""
    longest = max(len(engine.token_text(t).encode("utf-8")) for t in range(engine.info.n_vocab))
    return 4 * max(longest, 4)
