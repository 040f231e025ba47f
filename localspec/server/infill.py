"""llama.cpp server's ``/infill``: its line-end stops and its response bodies.

``LineStop`` applies the stops llama.cpp's FIM clients (llama.vscode, llama.vim) rely on, on the
engine thread as each chunk is emitted, so that the generation ends right after the chunk that
triggered them (its text is cut where llama.cpp cuts it):

- ``n_indent``: a line after the first whose first non-blank character (only spaces and tabs are
  blank) sits left of ``n_indent`` columns ends the completion; the text keeps that line's
  indentation, not its content. The completion stays inside the block being written.
- ``t_max_predict_ms``: once generating (after prefill) has taken this long, the next newline
  ends the completion, the newline included. (llama.cpp checks per token and keeps the whole
  token holding the newline; a step of several tokens is cut right after the newline.)
- ``n_predict: 0``: nothing is sent; the request only prefilled its prompt into the cache.

``InfillShape`` builds llama.cpp's bodies: ``content``, ``stop``, ``stop_type``,
``tokens_predicted``, ``tokens_evaluated``, ``timings`` and the rest, plus localspec's
``localspec`` object; a stream sends ``data:`` objects with ``stop: false`` and ends with the
final object (``content: ""``), without OpenAI's ``[DONE]``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from localspec.server.schemas import InfillRequest
from localspec.types import Chunk, GenerationParams, GenerationResult

_BLANK = " \t"


class LineStop:
    """One /infill request's stop rules (module docstring); ``see`` runs on the engine thread."""

    def __init__(self, n_indent: int, t_max_predict_ms: int, keep_nothing: bool = False) -> None:
        self.n_indent = n_indent
        self.t_max_predict_ms = t_max_predict_ms
        self.keep_nothing = keep_nothing
        self.text = ""  # what was handed on: the completion, once ``stopped``
        self.stopped = False
        self._scan = 0  # where in ``text`` to look for the next line start not yet judged

    @property
    def active(self) -> bool:
        return self.n_indent > 0 or self.t_max_predict_ms > 0 or self.keep_nothing

    def see(self, chunk: Chunk) -> Chunk:
        """The chunk as the client gets it; sets ``stopped`` when a rule ends the completion."""
        if self.stopped or self.keep_nothing:
            self.stopped = True
            return replace(chunk, text="")
        start = len(self.text)
        text = self.text + chunk.text
        cut = self._indent_cut(text) if self.n_indent > 0 else None
        if cut is None and self.t_max_predict_ms > 0:
            newline = text.find("\n", start)
            elapsed_ms = chunk.stats.generation_seconds * 1000.0
            if newline != -1 and elapsed_ms > self.t_max_predict_ms:
                cut = newline + 1
        if cut is not None:
            self.stopped = True
            text = text[:cut]
        self.text = text
        return replace(chunk, text=text[start:])

    def _indent_cut(self, text: str) -> int | None:
        """Where a line after the first, indented less than n_indent, starts its content."""
        newline = text.find("\n", self._scan)
        while newline != -1:
            pos = newline + 1
            while pos < len(text) and text[pos] in _BLANK:
                pos += 1
            if pos == len(text):  # the line's first character has not come yet
                self._scan = newline
                return None
            if pos - newline - 1 < self.n_indent:
                return pos
            self._scan = pos
            newline = text.find("\n", pos)
        self._scan = len(text)
        return None


@dataclass
class InfillShape:
    """Builds one /infill answer's bodies (llama.cpp's non-OpenAI shapes)."""

    model: str
    request: InfillRequest
    prompt_tokens: int
    prompt_text: str
    stop_rule: LineStop
    kind: str = "infill"

    def partial(self, chunk: Chunk) -> dict[str, Any] | None:
        if not chunk.text:
            return None
        return {
            "index": 0, "content": chunk.text,
            "tokens": list(chunk.tokens) if self.request.return_tokens else [],
            "stop": False, "id_slot": 0, "tokens_predicted": chunk.stats.n_tokens,
            "tokens_evaluated": self.prompt_tokens,
        }

    def final(self, result: GenerationResult, params: GenerationParams, extension: dict[str, Any],
              stopping_word: str, streamed: bool) -> dict[str, Any]:
        content = self.content(result)
        stats = result.stats
        predicted = 0 if self.stop_rule.keep_nothing else stats.n_tokens
        return {
            "index": 0,
            "content": "" if streamed else content,
            "tokens": result.tokens if self.request.return_tokens and not streamed else [],
            "id_slot": 0,
            "stop": True,
            "model": self.model,
            "tokens_predicted": predicted,
            "tokens_evaluated": stats.prompt_tokens or self.prompt_tokens,
            "generation_settings": _settings(params, self.request),
            "prompt": self.prompt_text,
            "has_new_line": "\n" in content,
            "truncated": False,  # the context is never shifted; FIM trimming is not truncation
            "stop_type": self.stop_type(result, stopping_word),
            "stopping_word": stopping_word,
            "tokens_cached": (stats.prompt_tokens or self.prompt_tokens) + stats.n_tokens,
            "timings": _timings(result, self.prompt_tokens),
            "localspec": extension,
        }

    def content(self, result: GenerationResult) -> str:
        if self.stop_rule.keep_nothing:
            return ""
        return self.stop_rule.text if self.stop_rule.stopped else result.text

    def stop_type(self, result: GenerationResult, stopping_word: str) -> str:
        if self.stop_rule.stopped or result.finish_reason != "stop":
            return "limit"
        return "word" if stopping_word else "eos"


def _settings(params: GenerationParams, request: InfillRequest) -> dict[str, Any]:
    return {
        "n_predict": 0 if request.n_predict == 0 else params.max_tokens,
        "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
        "min_p": params.min_p, "seed": params.seed, "stop": list(params.stop),
        "repeat_penalty": params.repeat_penalty, "repeat_last_n": params.penalty_last_n,
        "n_indent": request.n_indent, "t_max_predict_ms": request.t_max_predict_ms,
        "cache_prompt": params.reuse_cache, "speculative": params.speculative,
        "draft_max": params.draft_max,
    }


def _timings(result: GenerationResult, prompt_tokens: int) -> dict[str, float]:
    stats = result.stats
    prompt_n = (stats.prompt_tokens or prompt_tokens) - stats.cached_prompt_tokens
    prompt_ms = stats.prefill_seconds * 1000.0
    predicted_ms = stats.generation_seconds * 1000.0
    return {
        "cache_n": stats.cached_prompt_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1000.0 * prompt_n / prompt_ms if prompt_ms else 0.0,
        "predicted_n": stats.n_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / stats.n_tokens if stats.n_tokens else 0.0,
        "predicted_per_second": stats.tokens_per_second,
    }
