"""Terminal rendering of a benchmark report."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table

from localspec.bench.baseline import Baseline
from localspec.bench.ceiling import Ceiling
from localspec.bench.llama_speculative import SpeculativeBaseline
from localspec.bench.report import Report, Row
from localspec.bench.synthetic_mode import TheoryRow

COLUMNS = ("", "plain", "spec", "speedup", "±", "A/A", "accept %", "tau", "d/v/o %", "same")
CAPTION = (
    "plain, spec: tokens/s (prefill excluded) | speedup: spec / plain, median of paired repeats "
    "(groups: total tokens / total time) | ±: half the range over repeats | A/A: plain against "
    "plain on the same schedule (* spread >= 2%: too noisy to judge a 3% floor) | accept %: "
    "accepted / drafted | tau: tokens per target pass (both -: nothing was drafted) | d/v/o %: "
    "time drafting / verifying / other | same: output identical to plain (tie: only at "
    "numerical ties)"
)
WIDE_SPREAD = 0.05  # a speedup whose repeats disagree by more than this is flagged with "!"


def _cells(row: Row) -> list[str]:
    total = row.draft_seconds + row.verify_seconds + row.other_seconds
    split = "/".join(f"{100 * t / total:.0f}" for t in
                     (row.draft_seconds, row.verify_seconds, row.other_seconds)) if total else "-"
    spread = f"{100 * row.speedup_spread:.0f}%" + ("!" if row.speedup_spread > WIDE_SPREAD else "")
    aa = f"{row.aa:.2f}" + ("" if row.trusted else "*")
    return [
        row.label, f"{row.plain_tps:.1f}", f"{row.speculative_tps:.1f}", f"{row.speedup:.2f}x",
        # Nothing drafted: no acceptance to show, and tau 1.00 would only restate plain decoding.
        spread, aa, f"{row.acceptance_rate:.0%}" if row.drafted else "-",
        f"{row.mean_accepted_length:.2f}" if row.drafted else "-", split,
        row.identical,
    ]


def _add_columns(table: Table, columns: Sequence[str], label_width: int = 32) -> None:
    """The first column holds the labels: never wrapped, cut with an ellipsis past the width."""
    table.add_column(columns[0], justify="left", no_wrap=True, max_width=label_width,
                     overflow="ellipsis")
    for name in columns[1:]:
        table.add_column(name, justify="right", no_wrap=True)


def _table(title: str, rows: Sequence[Row]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    _add_columns(table, COLUMNS, label_width=24)
    for row in rows:
        table.add_row(*_cells(row))
    return table


def print_report(report: Report, console: Console, *, per_prompt: bool) -> None:
    if per_prompt:
        console.print(_table("per prompt (medians over repeats)", report.prompts))
    console.print(_table("per category", report.categories + [report.overall]))
    if report.worst is not None:
        w = report.worst
        console.print(f"worst category: {w.category} {w.category_speedup:.2f}x | worst prompt: "
                      f"{w.prompt} {w.prompt_speedup:.2f}x")
    o = report.overall
    if o.valid != "-" or o.forced_drafted:
        rate = f"{o.forced_accepted / o.forced_drafted:.0%}" if o.forced_drafted else "-"
        console.print(f"grammar-forced drafts: {o.forced_drafted} drafted, {rate} accepted, "
                      f"{o.candidate_rows} rows verified at their candidates | "
                      f"every output valid against its JSON Schema: {o.valid}")
    if report.draft_cost is not None:
        d = report.draft_cost
        console.print(f"draft cost c = {d.c:.3f}: {d.draft_ms:.2f} ms per model-drafted token "
                      f"({d.drafted} tokens) / {d.plain_pass_ms:.2f} ms per plain pass")
    console.print(CAPTION, style="dim")


BASELINE_COLUMNS = ("", "lcp plain tok/s", "lcp lookup tok/s", "lookup accept %",
                    "localspec plain tok/s", "localspec spec tok/s", "plain vs plain",
                    "spec vs lookup", "same plain output")


def print_baseline(baseline: Baseline, console: Console, *, drafter: str = "ngram") -> None:
    """llama-cpp-python's arms next to localspec's, or the sentence saying why not."""
    if baseline.error is not None:
        console.print(f"llama-cpp-python baseline skipped: {baseline.error}.")
        return
    spec = "localspec n-gram" if drafter == "ngram" else "localspec speculative"
    table = Table(
        title=f"baseline: llama-cpp-python {baseline.llama_cpp_version} (lcp); prompt lookup with "
        f"num_pred_tokens={baseline.num_pred_tokens}, max_ngram_size={baseline.max_ngram_size}",
        caption=f"spec vs lookup = {spec} vs llama-cpp-python prompt lookup (tokens/s ratio); "
        "plain vs plain = localspec plain / llama-cpp-python plain; same plain output = prompts "
        "whose llama-cpp-python plain output equals localspec's (near-ties may flip between the "
        "two)",
        title_justify="left", caption_justify="left",
    )
    rows = baseline.categories + ([baseline.overall] if baseline.overall else [])
    _add_columns(table, BASELINE_COLUMNS)
    for row in rows:
        table.add_row(
            row.label, f"{row.llamacpp_plain_tps:.1f}", f"{row.llamacpp_lookup_tps:.1f}",
            f"{row.lookup_acceptance_rate:.0%}", f"{row.localspec_plain_tps:.1f}",
            f"{row.localspec_speculative_tps:.1f}", f"{row.plain_vs_plain:.2f}x",
            f"{row.speculative_vs_lookup:.2f}x", f"{row.plain_outputs_same}/{row.n_prompts}",
        )
    console.print(table)


def print_llama_speculative(baseline: SpeculativeBaseline, console: Console) -> None:
    """llama.cpp's own speculative arms (llama-speculative-simple) next to localspec's."""
    if baseline.error is not None:
        console.print(f"llama-speculative baseline skipped: {baseline.error}.")
        return
    rows = baseline.categories + ([baseline.overall] if baseline.overall else [])
    arms = [arm for arm in ("draft-simple", "ngram-mod") if any(arm in r.arms for r in rows)]
    table = Table(title=f"baseline: llama.cpp's {baseline.program}, same prompts and length",
                  caption="tok/s (after the prompt) | acc %: accepted / drafted | tau: "
                  "tokens a verifying pass emitted | best vs best: localspec's "
                  "faster arm / llama.cpp's fastest (with llama-cpp-python's arms when both "
                  "baselines ran)",
                  title_justify="left", caption_justify="left")
    columns = [""] + [f"{arm}\n{what}" for arm in arms for what in ("tok/s", "acc %", "tau")]
    _add_columns(table, (*columns, "localspec\nplain", "localspec\nspec", "best vs\nbest"))
    for row in rows:
        cells = [row.label]
        for arm in arms:
            figures = row.arms.get(arm)
            if figures is None:
                cells += ["-"] * 3
                continue
            cells += [f"{figures.tokens_per_second:.1f}",
                      f"{figures.acceptance_rate:.0%}" if figures.drafted else "-",
                      f"{figures.mean_accepted_length:.2f}" if figures.drafted else "-"]
        cells += [f"{row.localspec_plain_tps:.1f}", f"{row.localspec_speculative_tps:.1f}",
                  f"{row.best_vs_best:.2f}x"]
        table.add_row(*cells)
    console.print(table)


THEORY_COLUMNS = ("", "k", "a (per token)", "accept %", "tau", "E", "c", "v(k+1)",
                  "S theory", "S measured", "measured / theory")


def print_theory(rows: Sequence[TheoryRow], console: Console) -> None:
    """Measured speedup next to S = E / (k*c + v(k+1)) (docs/design.md, "The controller")."""
    table = Table(title="synthetic pair: speed limit S = E / (k*c + v(k+1)), "
                  "E = (1 - a^(k+1)) / (1 - a)", title_justify="left")
    _add_columns(table, THEORY_COLUMNS)
    for row in rows:
        c = row.costs
        table.add_row(
            row.label, str(c.k), f"{c.a:.3f}", f"{c.acceptance_rate:.0%}", f"{c.tau:.2f}",
            f"{c.expected_tokens:.2f}", f"{c.c:.3f}", f"{c.v:.3f}",
            f"{c.theoretical_speedup:.2f}x", f"{c.measured_speedup:.2f}x", f"{c.efficiency:.0%}",
        )
    console.print(table)


def print_ceiling(ceiling: Ceiling, console: Console) -> None:
    """Measured speedup next to the n-gram ceiling (localspec.bench.ceiling)."""
    costs = ", ".join(f"{r}: {v:.2f}" for r, v in enumerate(ceiling.pass_costs) if r > 0)
    table = Table(
        title="n-gram ceiling: an oracle that knows how many lookup tokens the target accepts, "
        "replaying the same plain outputs with the pass costs measured in this run",
        caption=f"pass cost by rows, in 1-row passes (median): {costs}",
        title_justify="left", caption_justify="left",
    )
    _add_columns(table, ("", "speedup", "ceiling", "of ceiling"))
    above = False
    for row in ceiling.rows:
        mark = "*" if row.speedup > row.ceiling else ""
        above = above or bool(mark)
        table.add_row(row.label, f"{row.speedup:.2f}x", f"{row.ceiling:.2f}x{mark}",
                      f"{row.of_ceiling:.0%}")
    console.print(table)
    if above:
        console.print("* measured above the ceiling: the ceiling prices every pass at this run's "
                      "median pass costs, so a run whose passes were faster than those medians "
                      "(noise, another load ending) can beat it; compare the A/A column.",
                      style="dim")


def print_serving(rows: Sequence[dict[str, float]], parallel: int, console: Console) -> None:
    """Batched serving (localspec.bench.serving): --parallel N against --parallel 1."""
    table = Table(title=f"batched serving: --parallel {parallel} against --parallel 1 "
                  "(aggregate tokens/s, median time to first token)", title_justify="left")
    _add_columns(table, ("clients", "tok/s p1", f"tok/s p{parallel}", "throughput",
                         "TTFT p1 (s)", f"TTFT p{parallel} (s)", "TTFT ratio"))
    for row in rows:
        table.add_row(
            str(int(row["clients"])), f"{row['tokens_per_second_parallel_1']:.1f}",
            f"{row[f'tokens_per_second_parallel_{parallel}']:.1f}",
            f"{row['throughput_ratio']:.2f}x", f"{row['median_ttft_parallel_1']:.2f}",
            f"{row[f'median_ttft_parallel_{parallel}']:.2f}", f"{row['ttft_ratio']:.2f}",
        )
    console.print(table)
