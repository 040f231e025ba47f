"""The speculative-decoding speed limit (docs/design.md, "The controller") and its inputs, measured
from a benchmark.

With a per-token acceptance probability a (each drafted token is accepted independently with
probability a, until the first rejection) and k drafted tokens per step, one target pass emits
on average

    E(a, k) = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a)

tokens (the accepted prefix plus one correction or bonus token). A step costs k draft tokens
plus one verification pass over k + 1 rows; in units of one plain target pass that is
k*c + v(k+1), so the best speedup over plain decoding is

    S = E(a, k) / (k*c + v(k+1)).

``estimate_costs`` measures a, c and v(k+1) from the statistics of a plain run and a
speculative run with a fixed k; the bench prints S next to the measured speedup.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localspec.types import GenerationStats, mean_accepted_length


def expected_tokens(a: float, k: int) -> float:
    """E = (1 - a^(k+1)) / (1 - a): tokens emitted per target pass (k + 1 when a = 1)."""
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance {a!r} must be in [0, 1]")
    if k < 0:
        raise ValueError(f"draft length {k!r} must be >= 0")
    if a == 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def theoretical_speedup(a: float, k: int, c: float, v: float) -> float:
    """S = E(a, k) / (k*c + v): c = draft-token cost and v = cost of verifying k + 1 tokens,
    both relative to one plain target pass."""
    cost = k * c + v
    if cost <= 0:
        raise ValueError(f"step cost k*c + v = {cost!r} must be positive")
    return expected_tokens(a, k) / cost


def rejection_events(stats: GenerationStats) -> int:
    """Steps whose draft was cut short by a rejection (at most one per step).

    A step reaches position i when it accepted positions 0..i-1; it is rejected at i when it
    drafted position i and did not accept it. Steps reaching i and drafting i are counted as
    min(accepted_by_position[i-1], drafted_by_position[i]) (all drafting steps for i = 0),
    which is exact when every step drafts the same number of tokens (a fixed k).
    """
    drafted, accepted = stats.drafted_by_position, stats.accepted_by_position
    events = 0
    for i, d in enumerate(drafted):
        reached = d if i == 0 else min(accepted[i - 1], d)
        events += max(0, reached - (accepted[i] if i < len(accepted) else 0))
    return events


def per_token_acceptance(stats: Sequence[GenerationStats]) -> float:
    """a = accepted / (accepted + rejection events): the maximum-likelihood estimate of the
    per-token acceptance probability when each step stops at its first rejection."""
    accepted = sum(s.accepted for s in stats)
    trials = accepted + sum(rejection_events(s) for s in stats)
    return accepted / trials if trials else 0.0


@dataclass(frozen=True)
class Costs:
    """Measured inputs of the speed limit and what it predicts."""

    k: int  # longest draft made (the fixed --draft-max, unless cut by max_tokens)
    a: float  # per-token acceptance (see per_token_acceptance)
    acceptance_rate: float  # accepted / drafted
    tau: float  # measured tokens per target pass
    c: float  # seconds per drafted token / seconds per plain target pass
    v: float  # seconds per verification pass (k + 1 rows) / seconds per plain target pass
    expected_tokens: float  # E(a, k)
    theoretical_speedup: float  # E / (k*c + v)
    measured_speedup: float  # speculative tokens/s / plain tokens/s
    efficiency: float  # measured / theoretical: how close the implementation is to the limit


def _seconds_per(total: float, count: int) -> float:
    return total / count if count else 0.0


def plain_pass_seconds(plain_stats: Sequence[GenerationStats]) -> float:
    """One plain target pass: the plain arm's verification seconds per pass (decode of one row
    + argmax; the unit the draft cost c and the pass costs v are counted in)."""
    return _seconds_per(sum(s.verify_seconds for s in plain_stats),
                        sum(s.target_passes for s in plain_stats))


def _tokens_per_second(stats: Sequence[GenerationStats]) -> float:
    seconds = sum(s.generation_seconds for s in stats)
    return sum(s.n_tokens for s in stats) / seconds if seconds > 0 else 0.0


def estimate_costs(
    plain_stats: Sequence[GenerationStats], spec_stats: Sequence[GenerationStats]
) -> Costs:
    """a, c and v(k+1) from a plain run and a speculative run with a fixed draft length.

    One plain target pass costs the plain arm's verification seconds per pass (decode of one
    row + argmax; the same work the speculative arm times as verification, over k + 1 rows).
    c = draft seconds per drafted token over that; v = verification seconds per speculative
    pass over that. Bookkeeping outside drafting and verification is left out of the limit,
    so measured / theoretical shows what the rest of the implementation costs.
    """
    k = max((len(s.drafted_by_position) for s in spec_stats), default=0)
    pass_seconds = plain_pass_seconds(plain_stats)
    draft_token = _seconds_per(sum(s.draft_seconds for s in spec_stats),
                               sum(s.drafted for s in spec_stats))
    verify_pass = _seconds_per(sum(s.verify_seconds for s in spec_stats),
                               sum(s.target_passes for s in spec_stats))
    c = draft_token / pass_seconds if pass_seconds > 0 else 0.0
    v = verify_pass / pass_seconds if pass_seconds > 0 else 0.0
    a = per_token_acceptance(spec_stats)
    drafted = sum(s.drafted for s in spec_stats)
    passes = sum(s.target_passes for s in spec_stats)
    theory = theoretical_speedup(a, k, c, v) if k * c + v > 0 else 0.0
    plain_tps = _tokens_per_second(plain_stats)
    measured = _tokens_per_second(spec_stats) / plain_tps if plain_tps > 0 else 0.0
    return Costs(
        k=k,
        a=a,
        acceptance_rate=sum(s.accepted for s in spec_stats) / drafted if drafted else 0.0,
        tau=mean_accepted_length(sum(s.accepted for s in spec_stats), passes),
        c=c,
        v=v,
        expected_tokens=expected_tokens(a, k),
        theoretical_speedup=theory,
        measured_speedup=measured,
        efficiency=measured / theory if theory > 0 else 0.0,
    )
