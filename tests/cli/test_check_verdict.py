"""`localspec check`'s verdict from hand-made statistics: a controller that declined to draft,
the draft model's cost bound, and the other drafter that pays (commands/check_verdict.py)."""

from __future__ import annotations

import pytest

from localspec.bench.prompts import Prompt
from localspec.bench.report import summarize
from localspec.bench.runner import PromptRun
from localspec.bench.theory import expected_tokens
from localspec.commands.check import Verdict, render_measurement
from localspec.commands.check_verdict import (
    Alternative,
    draft_cost,
    drafting_of,
    speedup_bound,
    why_lines,
)
from localspec.types import GenerationParams, GenerationStats, mean_accepted_length


def run_stats(n_tokens: int, seconds: float, drafting_steps: int = 0, drafted: int = 0,
              accepted: int = 0, model_seconds: float = 0.0) -> GenerationStats:
    """A run of ``n_tokens`` whose ``drafting_steps`` steps drafted ``drafted`` tokens in all
    (by a draft model, in ``model_seconds``), of which ``accepted`` were accepted."""
    passes = n_tokens - accepted
    return GenerationStats(
        n_tokens=n_tokens, generation_seconds=seconds, tokens_per_second=n_tokens / seconds,
        target_passes=passes, drafted=drafted, accepted=accepted, rejected=drafted - accepted,
        acceptance_rate=accepted / drafted if drafted else 0.0,
        mean_accepted_length=mean_accepted_length(accepted, passes),
        drafted_by_position=[drafting_steps] if drafting_steps else [],
        model_drafted=drafted, model_draft_seconds=model_seconds,
    )


def declined_runs() -> list[PromptRun]:
    """What `check` saw on the real pair: 9 drafts, all accepted, in 3 of ~190 steps."""
    runs = []
    for i in range(3):
        plain = run_stats(64, 20.0)
        spec = run_stats(64, 19.6, drafting_steps=1, drafted=3, accepted=3, model_seconds=0.3)
        runs.append(PromptRun(Prompt(f"p{i}", "code", "x"), [plain], [spec], [plain]))
    return runs


def test_a_declining_controller_is_said_and_acceptance_is_not_trusted() -> None:
    runs = declined_runs()
    drafting = drafting_of(runs)
    assert drafting.declined and (drafting.drafted, drafting.drafting_steps) == (9, 3)
    verdict = Verdict(drafting, why_lines(drafting, None, None, 1.05), [])
    text = render_measurement(summarize(runs), 3, GenerationParams(max_tokens=64), verdict)
    assert "100.0% (drafted 9, accepted 9): only 3 of 183 steps drafted, too few" in text
    assert "hardly: 1.02x, within noise of plain decoding: the controller hardly drafted" in text
    assert "the controller drafted at 3 of 183 steps" in text


def test_nothing_drafted_shows_a_dash() -> None:
    plain = run_stats(64, 20.0)
    runs = [PromptRun(Prompt("p", "code", "x"), [plain], [plain], [plain])]
    drafting = drafting_of(runs)
    text = render_measurement(summarize(runs), 1, GenerationParams(max_tokens=64),
                              Verdict(drafting, [], []))
    assert "acceptance rate        - (nothing drafted" in text


def test_a_drafting_controller_is_not_called_declining() -> None:
    spec = run_stats(64, 10.0, drafting_steps=16, drafted=64, accepted=32, model_seconds=1.0)
    runs = [PromptRun(Prompt("p", "code", "x"), [run_stats(64, 20.0)], [spec], [])]
    drafting = drafting_of(runs)
    assert not drafting.declined
    text = render_measurement(summarize(runs), 1, GenerationParams(max_tokens=64),
                              Verdict(drafting, [], []))
    assert "50.0% (drafted 64, accepted 32)\n" in text and "yes: the draft makes" in text


def test_the_draft_cost_bound_says_when_a_draft_model_cannot_pay() -> None:
    runs = declined_runs()  # plain: 20 s for 64 passes; drafts: 0.9 s for 9 tokens
    cost = draft_cost(runs, None)
    assert cost is not None
    assert cost.token_seconds == pytest.approx(0.1) and cost.pass_seconds == pytest.approx(20 / 64)
    bound, k = speedup_bound(0.846, cost.ratio)
    assert bound == pytest.approx(max(expected_tokens(0.846, j) / (1 + j * cost.ratio)
                                      for j in range(1, 9)))
    line = why_lines(drafting_of(runs), cost, 0.846, 1.05)[1]
    assert line.startswith("  a drafted token costs 100.0 ms, 32% of a target pass (312.5 ms)")
    assert f"at 84.6% acceptance a draft of {k} gives at most {bound:.2f}x" in line
    assert line.endswith("the draft model cannot pay on this machine") == (bound < 1.05)
    cheap = why_lines(drafting_of(runs), draft_cost(runs, None), 0.99, 1.05)[1]
    assert "cannot pay" not in cheap  # with 99% acceptance even a 32% draft pays
    plain_only = [PromptRun(Prompt("p", "code", "x"), [run_stats(8, 1.0)], [run_stats(8, 1.0)])]
    assert draft_cost(plain_only, None) is None  # no model drafted: nothing to time
    probe = run_stats(16, 1.0, drafting_steps=4, drafted=16, accepted=8, model_seconds=0.8)
    assert draft_cost(plain_only, probe).token_seconds == pytest.approx(0.05)  # type: ignore[union-attr]


def test_the_answer_names_the_drafter_that_pays() -> None:
    runs = declined_runs()
    drafting = drafting_of(runs)
    alternatives = [Alternative("ngram", 1.06, 40, 30), Alternative("hybrid:d.gguf", 0.9, 50, 20)]
    text = render_measurement(summarize(runs), 3, GenerationParams(max_tokens=64),
                              Verdict(drafting, [], alternatives))
    assert "Use --draft ngram instead: 1.06x on your prompts." in text
    slow = [Alternative("ngram", 1.0, 0, 0)]
    text = render_measurement(summarize(runs), 3, GenerationParams(max_tokens=64),
                              Verdict(drafting, [], slow))
    assert "instead" not in text
