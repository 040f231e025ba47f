"""OpenAI's logprobs objects from the engine's per-token log probabilities.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``. Completions
(the legacy shape): ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
"text_offset"}``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from localspec.types import TokenLogprob

Piece = Callable[[int], str]


def chat_logprobs(logprobs: Sequence[TokenLogprob], piece: Piece) -> dict[str, Any]:
    def entry(token: int, logprob: float) -> dict[str, Any]:
        text = piece(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    content = [
        {**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
        for lp in logprobs
    ]
    return {"content": content}


def completion_logprobs(
    logprobs: Sequence[TokenLogprob], piece: Piece, offset: int = 0
) -> dict[str, Any]:
    tokens, offsets = [], []
    for lp in logprobs:
        text = piece(lp.token)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": [{piece(t): v for t, v in lp.top} for lp in logprobs],
        "text_offset": offsets,
    }
