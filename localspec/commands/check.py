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
from dataclasses import replace
from typing import Any

from localspec import _core
from localspec.bench.draft_agreement import Agreement, measure_agreement
from localspec.bench.prompts import load_prompts
from localspec.bench.report import Report, Row, summarize
from localspec.bench.runner import PromptRun, run_comparison
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
from localspec.runtime.learned import restore_saved
from localspec.runtime.loading import check_model_path, resolved_drafter
from localspec.types import GenerationParams

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


def _answer(row: Row) -> str:
    if row.speedup >= HELPS:
        return f"yes: the draft makes generation {row.speedup:.2f}x as fast on this machine."
    if row.speedup >= EVEN:
        return f"hardly: {row.speedup:.2f}x, within noise of plain decoding."
    return (f"no: speculation runs at {row.speedup:.2f}x of plain decoding here; try a smaller "
            "draft, --draft ngram, or a shorter --draft-max.")


def render_measurement(report: Report, n_prompts: int, params: GenerationParams) -> str:
    row = report.overall
    lines = [
        f"Measurement ({n_prompts} prompt(s), {params.max_tokens} tokens each, greedy, "
        f"draft length {params.draft_max})",
        f"  acceptance rate        {row.acceptance_rate:.1%} "
        f"(drafted {row.drafted}, accepted {row.accepted})",
        f"  mean accepted length   {row.mean_accepted_length:.2f} tokens per target pass",
        f"  plain                  {row.plain_tps:.1f} tokens/s",
        f"  speculative            {row.speculative_tps:.1f} tokens/s",
        f"  measured speedup       {row.speedup:.2f}x",
        f"  identical to plain     {IDENTICAL.get(row.identical, row.identical)}",
        f"Will this draft help? {_answer(row)}",
    ]
    return "\n".join(lines)


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


def _measure(args: argparse.Namespace, choice: ModelChoice,
             params: GenerationParams) -> tuple[Report, int, str, dict[str, Any]]:
    categories = args.categories.split(",") if args.categories else None
    prompts = load_prompts(args.prompts, categories=categories, limit_per_category=args.limit)
    plan = plan_choice(args, choice)
    progress = None
    if sys.stderr.isatty() and not args.json:
        def progress(done: int, total: int) -> None:
            end = "\n" if done == total else ""
            print(f"\rmeasuring: {done}/{total} prompts", end=end, file=sys.stderr, flush=True)
    with load_engine(args, choice, plan=plan) as engine:
        saved = restore_saved(engine) if args.saved_stats else None
        runs = run_comparison(engine, prompts, params, progress=progress)
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
    return summarize(runs), len(prompts), plan_summary(plan), details


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
    report, n_prompts, memory, details = _measure(args, choice, params)
    row = report.overall
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
        }
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
        print(render_measurement(report, n_prompts, params))
        agreement = details["agreement"]
        print(render_agreement(details["acceptance_by_position"],
                               Agreement(**agreement) if agreement else None))
    return 1 if row.identical == "NO" else 0
