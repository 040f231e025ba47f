"""Why `localspec check` answers as it does: whether the controller drafted at all, what a
model's draft token costs against a target pass, and which other drafter pays on the same prompts.

A measured speedup near 1.0x says nothing about the draft when the controller chose not to draft
(it drafts only when its estimate says drafting pays, docs/design.md, "The controller"): the
speculative arm then ran as plain decoding, and an acceptance rate over a handful of drafts is
noise. For a draft model, the bound below says whether it could pay at all on this machine:
with per-token acceptance a and a draft token costing c target passes, a draft of k tokens
yields E(a, k) tokens per step for at least 1 + k*c passes (localspec.bench.theory), so the
speedup is at most max_k E(a, k) / (1 + k*c), even if verifying k + 1 rows cost one pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localspec.bench.runner import PromptRun
from localspec.bench.theory import expected_tokens
from localspec.types import GenerationStats

DECLINED_SHARE = 0.1  # fewer drafted tokens than this share of the generated ones: declined
BOUND_MAX_K = 8  # the draft lengths the bound tries
PROBE_TOKENS, PROBE_DRAFT_MAX = 16, 4  # the short fixed-k run that times a draft model
ALTERNATIVE_PROMPTS, ALTERNATIVE_TOKENS = 3, 32  # other drafters: a few prompts, few tokens


@dataclass(frozen=True)
class Drafting:
    """How much the speculative arm drafted."""

    tokens: int  # generated tokens
    drafted: int
    drafting_steps: int  # target passes that verified a draft
    passes: int

    @property
    def declined(self) -> bool:
        """The controller drafted (almost) nothing: the arm measured plain decoding."""
        return self.drafted < DECLINED_SHARE * self.tokens


def drafting_of(runs: Sequence[PromptRun]) -> Drafting:
    spec = [s for run in runs for s in run.speculative]
    return Drafting(
        tokens=sum(s.n_tokens for s in spec), drafted=sum(s.drafted for s in spec),
        drafting_steps=sum(s.drafted_by_position[0] for s in spec if s.drafted_by_position),
        passes=sum(s.target_passes for s in spec),
    )


@dataclass(frozen=True)
class DraftCost:
    """A draft model's seconds per drafted token against a plain target pass's seconds."""

    token_seconds: float
    pass_seconds: float

    @property
    def ratio(self) -> float:
        """c: one drafted token in target passes."""
        return self.token_seconds / self.pass_seconds


def draft_cost(runs: Sequence[PromptRun], probe: GenerationStats | None) -> DraftCost | None:
    """From the speculative arm's model drafts (and the probe's, when the controller made too
    few to time) and the plain arm's passes; None when no model drafted."""
    spec = [s for run in runs for s in run.speculative] + ([probe] if probe else [])
    plain = [s for run in runs for s in run.plain]
    drafted = sum(s.model_drafted for s in spec)
    passes = sum(s.target_passes for s in plain)
    seconds = sum(s.generation_seconds for s in plain)
    if drafted == 0 or passes == 0 or seconds <= 0:
        return None
    return DraftCost(sum(s.model_draft_seconds for s in spec) / drafted, seconds / passes)


def speedup_bound(acceptance: float, c: float) -> tuple[float, int]:
    """(max over k of E(a, k) / (1 + k*c), that k): the most a draft with per-token acceptance
    a and cost c could give, verification counted as one pass whatever its rows."""
    return max((expected_tokens(acceptance, k) / (1 + k * c), k)
               for k in range(1, BOUND_MAX_K + 1))


def acceptance_text(drafted: int, accepted: int, drafting: Drafting) -> str:
    """The acceptance rate line's value: '-' when nothing was drafted, a warning when few."""
    if drafted == 0:
        return "- (nothing drafted: the controller chose plain decoding at every step)"
    text = f"{accepted / drafted:.1%} (drafted {drafted}, accepted {accepted})"
    if drafting.declined:
        text += (f": only {drafting.drafting_steps} of {drafting.passes} steps drafted, too "
                 "few drafts to judge")
    return text


def why_lines(drafting: Drafting, cost: DraftCost | None, acceptance: float | None,
              helps: float) -> list[str]:
    """Why the draft does or does not pay: the controller's choice, then the cost bound."""
    lines = []
    if drafting.declined:
        lines.append(
            f"  the controller drafted at {drafting.drafting_steps} of {drafting.passes} steps: "
            "its measured costs and acceptance said drafting would not pay, so the speculative "
            "run was (almost) plain decoding and its speedup says nothing about the draft")
    if cost is not None:
        line = (f"  a drafted token costs {1000 * cost.token_seconds:.1f} ms, "
                f"{cost.ratio:.0%} of a target pass ({1000 * cost.pass_seconds:.1f} ms)")
        if acceptance is not None:
            bound, k = speedup_bound(acceptance, cost.ratio)
            line += (f"; at {acceptance:.1%} acceptance a draft of {k} gives at most "
                     f"{bound:.2f}x even if verifying it cost one pass")
            if bound < helps:
                line += ": the draft model cannot pay on this machine"
        lines.append(line)
    return lines


@dataclass(frozen=True)
class Alternative:
    """Another drafter measured on the first prompts."""

    drafter: str
    speedup: float
    drafted: int
    accepted: int

    def to_dict(self) -> dict[str, object]:
        return {"drafter": self.drafter, "speedup": self.speedup, "drafted": self.drafted,
                "accepted": self.accepted}


def alternative_lines(alternatives: Sequence[Alternative], n_prompts: int, tokens: int,
                      helps: float) -> list[str]:
    if not alternatives:
        return []
    lines = [f"Other drafters on your prompts ({n_prompts} prompt(s), {tokens} tokens each):"]
    width = max(len(alt.drafter) for alt in alternatives)
    for alt in alternatives:
        rate = f"{alt.accepted / alt.drafted:.0%} accepted" if alt.drafted else "nothing drafted"
        lines.append(f"  --draft {alt.drafter:<{width}}  {alt.speedup:.2f}x ({rate})")
    best = max(alternatives, key=lambda a: a.speedup)
    if best.speedup >= helps:
        lines.append(f"  pays: --draft {best.drafter} ({best.speedup:.2f}x)")
    else:
        lines.append("  none of them pays here either: plain decoding (--draft none) is as fast")
    return lines
