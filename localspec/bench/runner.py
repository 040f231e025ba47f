"""Running the arms of a benchmark: plain decoding and speculation, same prompts and lengths.

Three arms per repeat: plain, speculative, and plain again (the A/A arm: plain against plain on
the same schedule, which shows how far two identical arms drift apart on this machine; a
speedup is only trusted to within that spread). Order matters on a shared machine: after a
warm-up, each prompt runs its arms back to back, rotating their order on every repeat, so slow
drifts (thermal, other processes) hit every arm alike.

A prompt with a JSON Schema (the ``structured`` set) runs constrained in every arm: the schema's
grammar shapes plain decoding and speculation alike, generation stops where the JSON ends (the
same length in both arms when their outputs are identical), and every output is checked against
the schema.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from localspec.bench.invariance import MAX_ROWS, differing_row_counts
from localspec.bench.lossless import Divergence, compare_greedy
from localspec.bench.prompts import Prompt
from localspec.runtime.engine import Engine
from localspec.text.grammar import json_schema_to_gbnf
from localspec.text.schema_check import schema_violation
from localspec.types import GenerationParams, GenerationResult, GenerationStats


@dataclass
class PromptRun:
    """All repeats of one prompt in both arms."""

    prompt: Prompt
    plain: list[GenerationStats] = field(default_factory=list)
    speculative: list[GenerationStats] = field(default_factory=list)
    plain_again: list[GenerationStats] = field(default_factory=list)  # the A/A arm
    identical: bool = True  # speculative tokens == plain tokens in every repeat (greedy)
    # Where they differed, the check of localspec.bench.lossless: "tie" (only the shape of the
    # target
    # passes differs) or "NO" (a real divergence).
    divergences: list[Divergence] = field(default_factory=list)
    plain_tokens: list[int] = field(default_factory=list)  # plain output of the first repeat
    prompt_tokens: list[int] = field(default_factory=list)
    # With a JSON Schema: what was wrong with the first output that broke it (None: every
    # output of every arm was valid JSON that the schema accepts).
    invalid: str | None = None
    # The first repeat's speculative result: its tokens and target passes, which
    # `--modes` replays in both modes (bench/modes.py, "same passes").
    schedule: GenerationResult | None = None
    # `--modes`, greedy: this mode's seconds for the target passes of both modes' schedules;
    # None outside `--modes` or when sampling.
    same_pass_seconds: float | None = None

    @property
    def valid(self) -> str:
        """"yes" (every output follows the schema), "NO", or "-" (no schema)."""
        if self.prompt.json_schema is None:
            return "-"
        return "NO" if self.invalid else "yes"

    @property
    def verdict(self) -> str:
        """"yes" (identical), "tie" (differs only by numerical ties) or "NO"."""
        if self.identical:
            return "yes"
        return "tie" if all(d.verdict == "tie" for d in self.divergences) else "NO"


Progress = Callable[[int, int], None]  # (done, total)


def constrained(params: GenerationParams, prompt: Prompt) -> GenerationParams:
    """The arm's settings for this prompt: with a JSON Schema, its grammar, until the JSON ends."""
    if prompt.json_schema is None:
        return params
    return replace(params, grammar=json_schema_to_gbnf(prompt.json_schema), ignore_eos=False)


def run_comparison(
    engine: Engine,
    prompts: Sequence[Prompt],
    params: GenerationParams,
    *,
    repeat: int = 1,
    progress: Progress | None = None,
    first_repeat: int = 0,
    warm: bool = True,
) -> list[PromptRun]:
    """Generate exactly `params.max_tokens` tokens per run (end-of-generation is ignored).
    ``first_repeat``: the index of the first repeat (it sets the arms' rotation), for a caller
    that runs one repeat at a time; ``warm``: run the warm-up first."""
    # Every run starts from an empty cache, so that each output can be replayed exactly.
    seed = params.seed if params.seed is not None else 0
    fixed = replace(params, ignore_eos=True, seed=seed, reuse_cache=False)
    plain = replace(fixed, speculative=False)
    if prompts and warm:
        short = replace(fixed, max_tokens=min(8, fixed.max_tokens))
        engine.generate(prompts[0].source, replace(short, speculative=False))
        engine.generate(prompts[0].source, short)
    runs: list[PromptRun] = []
    total, done = len(prompts) * repeat, 0
    for prompt in prompts:
        source = prompt.source
        tokens = source if isinstance(source, list) else engine.tokenize(source)
        run = PromptRun(prompt, prompt_tokens=tokens)
        for r in range(first_repeat, first_repeat + repeat):
            arms = [("plain", plain), ("speculative", fixed), ("plain_again", plain)]
            arms = arms[r % 3:] + arms[: r % 3]
            outputs = {}
            for name, arm_params in arms:
                result = engine.generate(source, constrained(arm_params, prompt))
                getattr(run, name).append(result.stats)
                outputs[name] = result
                if prompt.json_schema is not None and run.invalid is None:
                    run.invalid = schema_violation(result.text, prompt.json_schema)
            plain_tokens, spec = outputs["plain"].tokens, outputs["speculative"]
            if r == first_repeat:
                run.plain_tokens = list(plain_tokens)
                run.schedule = spec
            if params.temperature == 0 and plain_tokens != spec.tokens:
                run.identical = False
                divergence = compare_greedy(engine, run.prompt_tokens, plain_tokens, spec,
                                            exact=engine.info.exact,
                                            params=constrained(fixed, prompt))
                if divergence is not None:
                    run.divergences.append(divergence)
            done += 1
            if progress:
                progress(done, total)
        runs.append(run)
    return runs


def engine_header(engine: Engine, runs: Sequence[PromptRun]) -> dict[str, Any]:
    """Which heads computed the target's and the draft model's logits (README: output head),
    the mode, the RPC workers if any, and in exact mode whether passes of 1 .. 16 rows gave the
    first prompt's last positions the bits of single-token passes (docs/exact.md)."""
    out: dict[str, Any] = {"verify_head": engine.info.verify_head,
                           "draft_head": engine.info.draft_head,
                           "mode": "exact" if engine.info.exact else "default"}
    if engine.info.rpc:
        out["rpc"] = list(engine.info.rpc)
    tokens = runs[0].prompt_tokens + runs[0].plain_tokens if runs else []
    if engine.info.exact and len(tokens) > MAX_ROWS:
        out["rows_differing"] = differing_row_counts(engine, tokens)
    return out
