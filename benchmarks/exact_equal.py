"""Exact mode's promise on a real model: over every built-in prompt, greedy speculative output
equals plain output, for each drafter and draft length (docs/exact.md, "Speculative equals
plain on the default model").

    python benchmarks/exact_equal.py [--target GGUF] [--draft-model GGUF] [--head HEAD.gguf]
                               [--tokens 256] [--limit N] [--json OUT]

Plain output comes once per prompt, from an exact-mode engine with speculation off. Each
drafter then runs in an exact-mode engine of its own over the same target, with `auto` and
fixed draft lengths; any prompt whose tokens differ from plain is a bug and is listed.
Defaults: the embedded Gemma 3 270M, drafting for itself as the draft model (the only local
model with its tokenizer), and no head unless --head names one (`localspec train-head`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from localspec.bench.prompts import load_prompts
from localspec.models.sources import embedded_model_path
from localspec.runtime.engine import Engine
from localspec.types import GenerationParams

DRAFT_LENGTHS: tuple[int | str, ...] = ("auto", 3, 15)


def drafters(args: argparse.Namespace) -> dict[str, str]:
    chosen = {"n-gram": "ngram", "draft model": args.draft_model or args.target}
    if args.head:
        chosen["EAGLE-3 head after n-gram"] = f"eagle3:{args.head}"
        chosen["EAGLE-3 head alone"] = args.head
    return chosen


def compare(engine: Engine, prompts: list[Any], plain: dict[str, list[int]],
            params: GenerationParams, k: int | str) -> dict[str, Any]:
    differing, drafted, accepted = [], 0, 0
    for prompt in prompts:
        result = engine.generate(prompt.text, params, draft_max=k)
        drafted += result.stats.drafted
        accepted += result.stats.accepted
        if result.tokens != plain[prompt.id]:
            differing.append(prompt.id)
    return {"prompts": len(prompts), "differing": differing, "drafted": drafted,
            "accepted": accepted}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default=str(embedded_model_path()))
    parser.add_argument("--draft-model", help="a draft model (default: the target itself)")
    parser.add_argument("--head", help="an EAGLE-3 head for the target")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--limit", type=int, help="prompts per category (default: all)")
    parser.add_argument("--json", help="also write every number to this file")
    args = parser.parse_args()
    prompts = load_prompts(limit_per_category=args.limit)
    params = GenerationParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    started = time.monotonic()
    with Engine.load(args.target, draft="none", n_ctx=2048, exact=True,
                     n_gpu_layers=0) as plain_engine:
        plain = {p.id: plain_engine.generate(p.text, params, speculative=False).tokens
                 for p in prompts}
    print(f"{len(prompts)} prompts, {args.tokens} tokens, plain in "
          f"{time.monotonic() - started:.0f} s", flush=True)
    print("| drafter | draft length | prompts | differing | drafted | acceptance rate |")
    print("|---|---|---|---|---|---|")
    results: dict[str, Any] = {}
    for name, spec in drafters(args).items():
        with Engine.load(args.target, draft=spec, n_ctx=2048, exact=True, n_gpu_layers=0,
                         draft_sampling=False) as engine:
            for k in DRAFT_LENGTHS:
                row = compare(engine, prompts, plain, params, k)
                results[f"{name}, {k}"] = row
                rate = row["accepted"] / row["drafted"] if row["drafted"] else 0.0
                print(f"| {name} | {k} | {row['prompts']} | "
                      f"{' '.join([str(len(row['differing'])), *row['differing']])} | "
                      f"{row['drafted']} | {rate:.0%} |", flush=True)
    print(f"done in {time.monotonic() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
