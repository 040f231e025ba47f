"""Running the two arms of a benchmark: plain decoding and speculation, same prompts and lengths.

Order matters on a shared machine: after a warm-up, each prompt runs plain then speculative,
and the order flips on every repeat, so slow drifts (thermal, other processes) hit both arms.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from localspec.engine import Engine
from localspec.prompts import Prompt
from localspec.types import GenerationParams, GenerationStats


@dataclass
class PromptRun:
    """All repeats of one prompt in both arms."""

    prompt: Prompt
    plain: list[GenerationStats] = field(default_factory=list)
    speculative: list[GenerationStats] = field(default_factory=list)
    identical: bool = True  # speculative tokens == plain tokens in every repeat (greedy)
    # Where they differed: the target's top-2 logit gap at the first differing position
    # (a gap within TIE_TOLERANCE is a numerical tie between batched and single-row passes).
    divergence_gaps: list[float] = field(default_factory=list)
    plain_tokens: list[int] = field(default_factory=list)  # plain output of the first repeat

    @property
    def verdict(self) -> str:
        """"yes" (identical), "tie" (differs only at numerical ties) or "NO"."""
        if self.identical:
            return "yes"
        return "tie" if all(g <= TIE_TOLERANCE for g in self.divergence_gaps) else "NO"


Progress = Callable[[int, int], None]  # (done, total)
TIE_TOLERANCE = 0.02  # logits; quantized CPU matmuls differ by ~1e-3 between batch shapes


def divergence_gap(engine: Engine, prompt: str, expected: list[int], actual: list[int]) -> float:
    """Top-2 logit gap of the target where `actual` first departs from `expected`."""
    j = next((i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b), None)
    if j is None:
        return 0.0
    top2 = np.sort(engine.next_token_logits(engine.tokenize(prompt) + expected[:j]))[-2:]
    return float(top2[1] - top2[0])


def run_comparison(
    engine: Engine,
    prompts: Sequence[Prompt],
    params: GenerationParams,
    *,
    repeat: int = 1,
    progress: Progress | None = None,
) -> list[PromptRun]:
    """Generate exactly `params.max_tokens` tokens per run (end-of-generation is ignored)."""
    fixed = replace(params, ignore_eos=True, seed=params.seed if params.seed is not None else 0)
    plain = replace(fixed, speculative=False)
    warm = replace(fixed, max_tokens=min(8, fixed.max_tokens))
    if prompts:
        engine.generate(prompts[0].text, replace(warm, speculative=False))
        engine.generate(prompts[0].text, warm)
    runs: list[PromptRun] = []
    total, done = len(prompts) * repeat, 0
    for prompt in prompts:
        run = PromptRun(prompt)
        for r in range(repeat):
            arms = [("plain", plain), ("speculative", fixed)]
            if r % 2:
                arms.reverse()
            outputs = {}
            for name, arm_params in arms:
                result = engine.generate(prompt.text, arm_params)
                getattr(run, name).append(result.stats)
                outputs[name] = result.tokens
            if r == 0:
                run.plain_tokens = list(outputs["plain"])
            if params.temperature == 0 and outputs["plain"] != outputs["speculative"]:
                run.identical = False
                run.divergence_gaps.append(
                    divergence_gap(engine, prompt.text, outputs["plain"], outputs["speculative"])
                )
            done += 1
            if progress:
                progress(done, total)
        runs.append(run)
    return runs
