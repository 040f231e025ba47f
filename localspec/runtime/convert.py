"""Conversions between the typed Python values and the extension's plain types."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from localspec import _core
from localspec.types import (
    DraftMax,
    GenerationParams,
    GenerationStats,
    TokenLogprob,
    mean_accepted_length,
)

# With draft_max="auto" the controller picks k per step, up to the core's limit.
AUTO_DRAFT_MAX: int = _core.AUTO_DRAFT_MAX


def longest_draft(draft_max: DraftMax) -> int:
    """The longest draft a step may make: the core's limit for "auto", else the fixed length."""
    return AUTO_DRAFT_MAX if draft_max == "auto" else int(draft_max)


def params_to_core(params: GenerationParams, prompt: list[int]) -> _core.GenerateRequest:
    """Build the core request; ``params.seed`` must already be set."""
    request = _core.GenerateRequest()
    request.prompt = prompt
    request.sampling = _core.SamplingParams(
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        min_p=params.min_p,
        seed=params.seed or 0,
        repeat_penalty=params.repeat_penalty,
        frequency_penalty=params.frequency_penalty,
        presence_penalty=params.presence_penalty,
        penalty_last_n=params.penalty_last_n,
    )
    request.max_tokens = params.max_tokens
    request.draft_max = longest_draft(params.draft_max) if params.speculative else 0
    request.adaptive = params.draft_max == "auto"
    request.ignore_eos = params.ignore_eos
    request.reuse_cache = params.reuse_cache
    request.stop = list(params.stop)
    request.grammar = params.grammar or ""
    request.logprobs = params.top_logprobs if params.logprobs else -1
    return request


def logprobs_from_core(raw: list[Any], wanted: bool) -> list[TokenLogprob] | None:
    """The core's (token, logprob, top) tuples as TokenLogprob values (None when not asked)."""
    if not wanted:
        return None
    return [TokenLogprob(t, lp, tuple((i, v) for i, v in top)) for t, lp, top in raw]


def stats_from_core(raw: _core.GenerationStats) -> GenerationStats:
    """The core's statistics as the Python value type (its fields are the one list; tau is
    computed here by the one definition, ``types.mean_accepted_length``)."""
    stats = GenerationStats(**{f.name: getattr(raw, f.name) for f in fields(GenerationStats)
                               if f.name != "mean_accepted_length"})
    stats.mean_accepted_length = mean_accepted_length(stats.accepted, stats.target_passes)
    return stats
