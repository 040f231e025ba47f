"""`localspec check`: will this draft help this target? Vocabulary, then a short measurement.

The vocabulary check loads the two vocabularies only (fast). When they match, the pair is
loaded and a few built-in prompts (one per category by default) run plain and speculative,
greedy, with the same output length: acceptance rate, mean accepted length, both speeds and
the measured speedup on this machine. A mismatched pair exits with 2 and names the first
differing token.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from localspec import _core
from localspec.bench.draft_agreement import Agreement, measure_agreement
from localspec.bench.progress import LineProgress, work_line
from localspec.bench.prompts import Prompt, load_prompts
from localspec.bench.report import Report, Row, summarize
from localspec.bench.runner import PromptRun, run_comparison
from localspec.commands.check_verdict import (
    ALTERNATIVE_PROMPTS,
    ALTERNATIVE_TOKENS,
    PROBE_DRAFT_MAX,
    PROBE_TOKENS,
    Alternative,
    Drafting,
    acceptance_text,
    alternative_lines,
    draft_cost,
    drafting_of,
    why_lines,
)
from localspec.commands.common import (
    ModelChoice,
    add_draft_max_argument,
    add_model_arguments,
    choose_models,
    load_engine,
    plan_choice,
    plan_summary,
)
from localspec.drafter_spec import DrafterSpec
from localspec.errors import InvalidParameterError, VocabMismatchError
from localspec.models.gguf_reader import read_gguf
from localspec.runtime.engine import Engine
from localspec.runtime.learned import restore_saved
from localspec.runtime.loading import check_model_path, resolved_drafter
from localspec.types import GenerationParams, GenerationStats

VOCAB_TYPES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo-2"}
HELPS, EVEN = 1.05, 0.95  # speedup thresholds of the one-word answer
IDENTICAL = {  # the benchmark's verdicts on speculative vs plain greedy output
    "yes": "yes",
    "tie": "yes, up to numerical ties (the target's top two logits within 0.02)",
    "NO": "NO (speculation changed the output: please report it)",
}


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "check",
        help="check that a draft matches a target and measure whether it helps",
        description="Compare the draft's vocabulary with the target's (type, size, BOS/EOS, "
        "first differing token); when they match, run a few built-in prompts plain and "
        "speculative and report acceptance, mean accepted length and the measured speedup. "
        "Exits with 2 when the draft cannot draft for the target.",
    )
    add_model_arguments(parser)
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per run (default 64)")
    parser.add_argument("--limit", type=int, default=1, help="prompts per category (default 1)")
    parser.add_argument("--categories", help="comma-separated built-in categories (default: all)")
    parser.add_argument("--prompts", help="a JSONL prompt file (default: the built-in set)")
    add_draft_max_argument(parser, "auto")
    parser.add_argument("--vocab-only", action="store_true",
                        help="check the vocabularies only (default: also measure)")
    parser.add_argument("--saved-stats", action="store_true",
                        help="start the controller from the statistics `localspec run` saved for "
                        "this pair (default: from nothing)")
    parser.add_argument("--compare-drafters", action="store_true",
                        help=f"also measure --draft ngram and hybrid:MODEL on the first "
                        f"{ALTERNATIVE_PROMPTS} prompts, {ALTERNATIVE_TOKENS} tokens each "
                        "(default: only when a draft model does not pay)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (default: text)")
    parser.set_defaults(func=run)


def vocab_report(target: str, draft: str) -> dict[str, Any]:
    """``_core.compare_vocab`` plus type names and a ``compatible`` flag (vocabularies only)."""
    check_model_path(target, "target")
    check_model_path(draft, "draft")
    raw = _core.compare_vocab(target, draft)
    for role in ("target", "draft"):
        raw[role]["type_name"] = VOCAB_TYPES.get(raw[role]["type"], str(raw[role]["type"]))
    raw["compatible"] = not raw["problem"]
    return raw


def render_vocab(vocab: dict[str, Any]) -> str:
    t, d = vocab["target"], vocab["draft"]
    rows = [("", "target", "draft"), ("type", t["type_name"], d["type_name"]),
            ("tokens", str(t["n_tokens"]), str(d["n_tokens"])),
            ("BOS id", str(t["bos"]), str(d["bos"])), ("EOS id", str(t["eos"]), str(d["eos"]))]
    if vocab["first_difference"] >= 0:
        rows.append((f"token {vocab['first_difference']}", repr(vocab["target_text"]),
                     repr(vocab["draft_text"])))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = ["Vocabulary"] + ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths,
                                                                          strict=True)).rstrip()
                              for row in rows]
    first = vocab["first_difference"]
    lines.append("  first differing token: " + ("none" if first < 0 else str(first)))
    lines.append("  verdict: " + ("compatible" if vocab["compatible"]
                                  else f"INCOMPATIBLE: {vocab['problem']}"))
    return "\n".join(lines)


def _answer(row: Row, drafting: Drafting, alternatives: list[Alternative]) -> str:
    if row.speedup >= HELPS:
        answer = f"yes: the draft makes generation {row.speedup:.2f}x as fast on this machine."
    elif row.speedup >= EVEN:
        answer = f"hardly: {row.speedup:.2f}x, within noise of plain decoding"
        answer += (": the controller hardly drafted (why below)." if drafting.declined else ".")
    else:
        answer = f"no: speculation runs at {row.speedup:.2f}x of plain decoding here"
        answer += ("." if alternatives else
                   "; try a smaller draft, --draft ngram, or a shorter --draft-max.")
    best = max(alternatives, key=lambda a: a.speedup, default=None)
    if row.speedup < HELPS and best is not None and best.speedup >= HELPS:
        answer += f" Use --draft {best.drafter} instead: {best.speedup:.2f}x on your prompts."
    return answer


def render_measurement(report: Report, n_prompts: int, params: GenerationParams,
                       verdict: Verdict | None = None) -> str:
    row = report.overall
    verdict = verdict or Verdict(Drafting(0, row.drafted, 0, 0), [], [])
    lines = [
        f"Measurement ({n_prompts} prompt(s), {params.max_tokens} tokens each, greedy, "
        f"draft length {params.draft_max})",
        "  acceptance rate        "
        + acceptance_text(row.drafted, row.accepted, verdict.drafting),
        f"  mean accepted length   {row.mean_accepted_length:.2f} tokens per target pass",
        f"  plain                  {row.plain_tps:.1f} tokens/s",
        f"  speculative            {row.speculative_tps:.1f} tokens/s",
        f"  measured speedup       {row.speedup:.2f}x",
        f"  identical to plain     {IDENTICAL.get(row.identical, row.identical)}",
        f"Will this draft help? {_answer(row, verdict.drafting, verdict.alternatives)}",
        *verdict.why,
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class Verdict:
    """What explains the answer: how much was drafted, why (not) paying, other drafters."""

    drafting: Drafting
    why: list[str]
    alternatives: list[Alternative]


def acceptance_by_position(runs: list[PromptRun]) -> list[float]:
    """Share of the drafts made at each position of a step that were accepted (speculative arm)."""
    drafted: list[int] = []
    accepted: list[int] = []
    for stats in (s for run in runs for s in run.speculative):
        pairs = ((drafted, stats.drafted_by_position), (accepted, stats.accepted_by_position))
        for counts, add in pairs:
            counts.extend([0] * (len(add) - len(counts)))
            for i, n in enumerate(add):
                counts[i] += n
    return [a / d if d else 0.0 for a, d in zip(accepted, drafted, strict=True)]


def render_agreement(by_position: list[float], agreement: Agreement | None) -> str:
    shown = ", ".join(f"{i + 1}: {a:.0%}" for i, a in enumerate(by_position[:8]))
    shown = shown or "nothing drafted"
    lines = [f"  acceptance by position {shown}"]
    if agreement is not None:
        measured = f"{by_position[0]:.1%}" if by_position else "n/a (nothing drafted)"
        lines += [
            f"  predicted, 1 - TV(p,q) {agreement.one_minus_tv:.1%} for a drafted token sampled "
            f"from q; argmax agreement {agreement.top1:.1%} (greedy)",
            f"  measured, position 1   {measured} (greedy)",
            f"  logit cosine           {agreement.cosine:.3f} (a diagnostic, not the rule; "
            f"{agreement.positions} positions)",
        ]
    return "\n".join(lines)


def mtp_layers(target: str) -> str:
    """How the target's MTP layers draft: one layer, or several chained (position i, layer i)."""
    n = read_gguf(target, read_arrays=False).arch_int("nextn_predict_layers")
    if n <= 1:
        return "1 layer, drafting every position"
    return f"{n} layers, chained: draft position i runs layer i, at most {n} tokens per draft"


def _own_tokens(drafter: DrafterSpec, target: str) -> str:
    if drafter.kind == "mtp":
        return (f"the target's own MTP (NextN) layers draft ({mtp_layers(target)}), after n-gram "
                "lookup; they share its tokens")
    return "the n-gram drafter reuses the target's own tokens"


def _progress(args: argparse.Namespace, n_prompts: int,
              tokens: int) -> Callable[[int, int], None] | None:
    """A live counter on a terminal; else (a log, CI) the work up front and a line per prompt
    on stderr, so that a long check is never silent."""
    if not sys.stderr.isatty():
        print(work_line("check", n_prompts, 1, tokens), file=sys.stderr, flush=True)
        return LineProgress(sys.stderr, min_interval=0.0, label="check", unit="prompts").update
    if args.json:
        return None

    def progress(done: int, total: int) -> None:
        end = "\n" if done == total else ""
        print(f"\rmeasuring: {done}/{total} prompts", end=end, file=sys.stderr, flush=True)
    return progress


def _note(text: str) -> None:
    """A phase of the check, on stderr when it is not a terminal (a terminal sees the result)."""
    if not sys.stderr.isatty():
        print(f"check: {text}", file=sys.stderr, flush=True)


def _probe(engine: Engine, drafter: DrafterSpec, runs: list[PromptRun],
           prompt: Prompt) -> GenerationStats | None:
    """A short fixed-k run that times the draft model when the controller drafted too little
    with it to say what one of its tokens costs."""
    if drafter.kind not in ("model", "hybrid"):
        return None
    if sum(s.model_drafted for run in runs for s in run.speculative) >= PROBE_TOKENS:
        return None
    _note(f"timing the draft model ({PROBE_TOKENS} tokens, draft length {PROBE_DRAFT_MAX})")
    return engine.generate(prompt.text, GenerationParams(
        max_tokens=PROBE_TOKENS, temperature=0.0, draft_max=PROBE_DRAFT_MAX, ignore_eos=True,
        seed=0, reuse_cache=False)).stats


def _measure(args: argparse.Namespace, choice: ModelChoice, params: GenerationParams,
             prompts: list[Prompt]) -> tuple[Report, str, dict[str, Any], list[PromptRun],
                                             GenerationStats | None]:
    plan = plan_choice(args, choice)
    progress = _progress(args, len(prompts), params.max_tokens)
    with load_engine(args, choice, plan=plan) as engine:
        saved = restore_saved(engine) if args.saved_stats else None
        runs = run_comparison(engine, prompts, params, progress=progress)
        probe = _probe(engine, choice.drafter, runs, prompts[0])
        _note("measuring the draft's agreement with the target")
        agreement = measure_agreement(engine, choice.drafter,
                                      [(r.prompt_tokens, r.plain_tokens) for r in runs],
                                      args.threads or os.cpu_count() or 1)
        details = {"acceptance_by_position": acceptance_by_position(runs),
                 "agreement": agreement.to_dict() if agreement else None,
                 "verify_head": engine.info.verify_head, "draft_head": engine.info.draft_head,
                 "mode": "exact" if engine.info.exact else "default",
                 "saved_stats_used": saved is not None,
                 "saved_stats": saved.to_dict() if saved else None,
                 "saved_stats_note": saved.note() if saved else None}
    return summarize(runs), plan_summary(plan), details, runs, probe


def _alternatives(args: argparse.Namespace, choice: ModelChoice, params: GenerationParams,
                  prompts: list[Prompt], row: Row) -> list[Alternative]:
    """--draft ngram and hybrid:MODEL on the first prompts, when a draft model does not pay
    (or --compare-drafters): each loads the target again and runs a few short prompts."""
    drafter = choice.drafter
    if drafter.path is None or drafter.kind not in ("model", "hybrid"):
        return []
    if row.speedup >= HELPS and not args.compare_drafters:
        return []
    candidates = [DrafterSpec("ngram"), DrafterSpec("hybrid", drafter.path)]
    short = replace(params, max_tokens=min(params.max_tokens, ALTERNATIVE_TOKENS))
    out = []
    for spec in (c for c in candidates if c.kind != drafter.kind):
        _note(f"trying --draft {spec} on {len(prompts)} prompt(s), {short.max_tokens} tokens")
        with load_engine(args, replace(choice, drafter=spec)) as engine:
            overall = summarize(run_comparison(engine, prompts, short)).overall
        out.append(Alternative(str(spec), overall.speedup, overall.drafted, overall.accepted))
    return out


def run(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise InvalidParameterError(f"--limit {args.limit} is invalid: use 1 or more.")
    params = GenerationParams(max_tokens=args.max_tokens, temperature=0.0,
                              draft_max=(GenerationParams.draft_max if args.draft_max is None
                                         else args.draft_max), seed=0)
    params.validate()
    choice = choose_models(args)
    choice = replace(choice, drafter=resolved_drafter(choice.drafter, choice.target,
                                                      exact=args.exact))
    if not choice.drafter.drafts:
        raise InvalidParameterError("There is no drafter to check: pass --draft MODEL or "
                                    "--draft ngram.")
    out: dict[str, Any] = {"target": choice.target, "draft": str(choice.drafter)}
    if choice.drafter.kind == "mtp":
        out["mtp_layers"] = mtp_layers(choice.target)
    draft_path = choice.drafter.path
    vocab = None if draft_path is None else vocab_report(choice.target, draft_path)
    out["vocabulary"] = vocab
    if not args.json:
        print(f"Target: {choice.target}\nDraft:  {choice.drafter}")
        print(render_vocab(vocab) if vocab else
              "Vocabulary: " + _own_tokens(choice.drafter, choice.target))
    if vocab is not None and not vocab["compatible"]:
        if args.json:
            print(json.dumps({**out, "measurement": None}, ensure_ascii=False))
        raise VocabMismatchError(
            f"The draft '{choice.drafter}' cannot draft for the target '{choice.target}': "
            f"{vocab['problem']}; use a draft from the same model family, or --draft ngram."
        )
    if args.vocab_only:
        if args.json:
            print(json.dumps({**out, "measurement": None}, ensure_ascii=False))
        return 0
    categories = args.categories.split(",") if args.categories else None
    prompts = load_prompts(args.prompts, categories=categories, limit_per_category=args.limit)
    n_prompts = len(prompts)
    report, memory, details, runs, probe = _measure(args, choice, params, prompts)
    row = report.overall
    alternatives = _alternatives(args, choice, params, prompts[:ALTERNATIVE_PROMPTS], row)
    drafting = drafting_of(runs)
    cost = draft_cost(runs, probe)
    agreement_top1 = (details["agreement"] or {}).get("top1")
    acceptance = agreement_top1 if agreement_top1 is not None else (
        None if drafting.declined or not row.drafted else row.acceptance_rate)
    verdict = Verdict(drafting, why_lines(drafting, cost, acceptance, HELPS), alternatives)
    if args.json:
        out["memory"] = memory
        out.update(details)
        out["measurement"] = {
            "n_prompts": n_prompts, "max_tokens": params.max_tokens,
            "draft_max": params.draft_max, "plain_tps": row.plain_tps,
            "speculative_tps": row.speculative_tps, "speedup": row.speedup,
            "acceptance_rate": row.acceptance_rate,
            "mean_accepted_length": row.mean_accepted_length, "drafted": row.drafted,
            "accepted": row.accepted, "identical": row.identical,
            "helps": row.speedup >= HELPS,
            "categories": [vars(r) for r in report.categories],
            "controller_declined": drafting.declined,
            "drafting_steps": drafting.drafting_steps, "target_passes": drafting.passes,
            "draft_token_seconds": cost.token_seconds if cost else None,
            "target_pass_seconds": cost.pass_seconds if cost else None,
        }
        out["alternatives"] = [a.to_dict() for a in alternatives]
        out["why"] = [line.strip() for line in verdict.why]
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(f"Memory: {memory}")
        draft = f" | draft head: {details['draft_head']}" if details["draft_head"] else ""
        print(f"Mode: {details['mode']}" + (" (batch-invariant passes: any difference from plain "
                                          "output is a bug)" if details["mode"] == "exact" else ""))
        print(f"Target head: {details['verify_head']}{draft}")
        print("Controller: " + (f"started from {details['saved_stats_note']}"
                                if details["saved_stats_used"] else
                                "started from nothing (no saved statistics used)"))
        print(render_measurement(report, n_prompts, params, verdict))
        agreement = details["agreement"]
        print(render_agreement(details["acceptance_by_position"],
                               Agreement(**agreement) if agreement else None))
        for line in alternative_lines(alternatives, min(n_prompts, ALTERNATIVE_PROMPTS),
                                      min(params.max_tokens, ALTERNATIVE_TOKENS), HELPS):
            print(line)
    return 1 if row.identical == "NO" else 0
