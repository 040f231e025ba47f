"""Fill-in-the-middle, plain vs speculative, on the real coder pair (issue 49's FIM goal).

    LOCALSPEC_CACHE_DIR=... python benchmarks/fim/measure.py [--pair qwen2.5-coder-1.5b]
        [--draft ngram] [--cases benchmarks/fim/cases.jsonl] [--limit N] [--max-tokens 48]
        [--threads N] [--json OUT]

Each case of ``cases.jsonl`` (written by make_cases.py: completions cut from this repository's
Python and C++) becomes the FIM prompt ``POST /infill`` builds (localspec.text.fim), then is
generated greedily twice with the same engine: plain (``speculative=False``) and speculative,
each from a cold cache (``reuse_cache=False``: time to first token includes the prefill). Per
case: tokens, tokens/s of each and their ratio, time to first token of each, whether the two
outputs are identical, the acceptance rate, and whether the output starts with the expected
middle. The summary gives the median and worst ratio. Time nothing while other work runs on the
same cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from localspec.drafter_spec import DrafterSpec
from localspec.models.registry import resolve_pair
from localspec.runtime.engine import Engine
from localspec.text.fim import FimInput, model_fim_prompt
from localspec.types import GenerationParams, GenerationResult

CASES = Path(__file__).with_name("cases.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default=None,
                        help="drafter spelling (default: the pair's; 'ngram' is free)")
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--limit", type=int, default=None, help="the first N cases only")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--context-lines", type=int, default=None,
                        help="keep only this many lines of prefix and of suffix (a quick check; "
                        "default: the case's 40 and 20)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the rows here too")
    args = parser.parse_args()

    cases = [json.loads(line) for line in args.cases.read_text().splitlines() if line.strip()]
    cases = cases[: args.limit] if args.limit else cases
    pair = resolve_pair(args.pair, download=False)
    drafter = DrafterSpec.parse(args.draft) if args.draft else pair.drafter
    options: dict[str, Any] = {"n_ctx": pair.n_ctx}
    if args.threads:
        options["n_threads"] = args.threads
    greedy = GenerationParams(temperature=0, max_tokens=args.max_tokens, reuse_cache=False)
    rows = []
    with Engine.load(pair.target, drafter, **options) as engine:
        print(f"{pair.name}: target {pair.target.name}, drafter {engine.info.drafter}")
        engine.warm_up()
        for case in cases:
            fill = _fill(case, args.context_lines)
            tokens = model_fim_prompt(engine, fill, args.max_tokens).tokens
            plain = engine.generate(tokens, greedy, speculative=False)
            spec = engine.generate(tokens, greedy)
            rows.append(_row(case, len(tokens), plain, spec))
            _print(rows[-1])
    _summary(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


def _fill(case: dict[str, str], lines: int | None) -> FimInput:
    if lines is None:
        return FimInput(case["prefix"], case["suffix"])
    prefix = case["prefix"].splitlines(keepends=True)[-lines:] if lines else []
    suffix = case["suffix"].splitlines(keepends=True)[:lines]
    return FimInput("".join(prefix), "".join(suffix))


def _row(case: dict[str, str], prompt_tokens: int, plain: GenerationResult,
         spec: GenerationResult) -> dict[str, Any]:
    p, s = plain.stats, spec.stats
    return {
        "id": case["id"], "source": case["source"], "prompt_tokens": prompt_tokens,
        "tokens": s.n_tokens,
        "plain_tps": p.tokens_per_second, "spec_tps": s.tokens_per_second,
        "ratio": s.tokens_per_second / p.tokens_per_second if p.tokens_per_second else 0.0,
        "plain_ttft": p.time_to_first_token, "spec_ttft": s.time_to_first_token,
        "identical": plain.tokens == spec.tokens,
        "acceptance": s.acceptance_rate, "mean_accepted_length": s.mean_accepted_length,
        "middle_matches": spec.text.strip().startswith(case["middle"].strip().split("\n")[0]),
        "text": spec.text,
    }


def _print(row: dict[str, Any]) -> None:
    print(f"{row['id']} {row['source']:<40} {row['prompt_tokens']:5d} prompt tok "
          f"{row['tokens']:3d} tok  plain {row['plain_tps']:6.2f} tok/s  "
          f"spec {row['spec_tps']:6.2f} tok/s  x{row['ratio']:.2f}  "
          f"ttft {row['plain_ttft']:.2f}s/{row['spec_ttft']:.2f}s  "
          f"accept {row['acceptance']:.0%}  identical={row['identical']}  "
          f"middle={row['middle_matches']}  {row['text'][:60]!r}", flush=True)


def _summary(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    ratios = [r["ratio"] for r in rows]
    worst = min(rows, key=lambda r: r["ratio"])
    same = sum(r["identical"] for r in rows)
    middles = sum(r["middle_matches"] for r in rows)
    print(f"{len(rows)} cases: median x{statistics.median(ratios):.2f}, "
          f"worst x{worst['ratio']:.2f} ({worst['id']}), identical {same}/{len(rows)}, "
          f"expected middle {middles}/{len(rows)}")


if __name__ == "__main__":
    main()
