"""Predicted Outputs on edits (issue 49's measured goal): tokens/s of edit requests with the
original function as the `prediction`, against the same requests without one, greedy, on the
real pair, in one run.

Each edit (benchmarks/data/edits.jsonl: a function of 30-80 lines from localspec's own source
and a small requested change: a rename, a new parameter, a check, a message) is sent through
the model's chat template, asking for the whole updated function in a ```python block; its
prediction is that block with the original function. Arms per edit, back to back, their order
rotated on every repeat: plain (no drafting), the pair's drafter without a prediction, and the
same drafter with the prediction. Every output must be identical to plain's.

    python benchmarks/predicted_edits.py                      # the pair qwen2.5-coder-1.5b
    python benchmarks/predicted_edits.py --pair NAME --repeat 3 --max-tokens 512

Prints one row per edit (tokens/s per arm, the ratios, accepted / rejected prediction tokens)
and the median and worst ratio. Time nothing else on the machine while it runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from localspec.models.registry import resolve_pair
from localspec.runtime.convert import AUTO_DRAFT_MAX
from localspec.runtime.engine import Engine
from localspec.text.chat_template import chat_format, chat_tokens
from localspec.types import GenerationParams, GenerationResult

EDITS = Path(__file__).parent / "data" / "edits.jsonl"
REPLY = "Reply with only the complete updated function in one ```python code block."


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def load_edits(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def prompt_tokens(engine: Engine, template: str, edit: dict[str, Any]) -> list[int]:
    ask = f"{edit['instruction']} Keep everything else unchanged. {REPLY}"
    text = f"{ask}\n\n{fenced(edit['code'])}"
    return chat_tokens(template, [{"role": "user", "content": text}], engine.info, engine.tokenize)


def run_arm(engine: Engine, tokens: list[int], params: GenerationParams) -> GenerationResult:
    return engine.generate(tokens, params)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default=None, help="a drafter spelling instead of the pair's")
    parser.add_argument("--edits", type=Path, default=EDITS)
    parser.add_argument("--limit", type=int, default=None, help="the first N edits only")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=768)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)

    pair = resolve_pair(args.pair, download=False)
    drafter = args.draft or pair.drafter
    options = {} if args.threads is None else {"n_threads": args.threads}
    engine = Engine.load(pair.target, drafter, n_ctx=4096, **options)
    template = chat_format(engine.info.chat_template, pair.chat_template, pair.stop)
    base = GenerationParams(temperature=0.0, max_tokens=args.max_tokens, seed=0,
                            reuse_cache=False, stop=template.stop)
    arms = {
        "plain": replace(base, speculative=False),
        "drafter": base,
        "predicted": base,  # + the prediction, per edit
    }
    edits = load_edits(args.edits)[: args.limit]
    print(f"# {engine.info.target_name} drafted by {engine.info.drafter}; {len(edits)} edits, "
          f"{args.repeat} repeat(s), at most {args.max_tokens} tokens", file=sys.stderr)
    first = prompt_tokens(engine, template.template, edits[0])
    engine.generate(first, replace(base, max_tokens=8))
    # The bound: a perfect prediction drafts the longest "auto" draft (AUTO_DRAFT_MAX) at every
    # pass, so n tokens take ceil(n / (k + 1)) passes of k + 1 rows, V(k + 1) seconds each.
    k = AUTO_DRAFT_MAX
    costs = engine.pass_seconds(first, k + 1)
    print("# pass seconds by rows: " + ", ".join(f"{r}: {costs[r] * 1000:.0f} ms"
                                                for r in (1, 2, 4, 8, 12, k + 1)), file=sys.stderr)
    rows = []
    for edit in edits:
        tokens = prompt_tokens(engine, template.template, edit)
        prediction = fenced(edit["code"])
        speed: dict[str, list[float]] = {name: [] for name in arms}
        outputs: dict[str, GenerationResult] = {}
        for r in range(args.repeat):
            order = list(arms)[r % 3:] + list(arms)[: r % 3]
            for name in order:
                params = arms[name]
                if name == "predicted":
                    params = replace(params, prediction=prediction)
                result = run_arm(engine, tokens, params)
                speed[name].append(result.stats.tokens_per_second)
                outputs[name] = result
        plain = outputs["plain"]
        row = {
            "id": edit["id"],
            "tokens": plain.stats.n_tokens,
            "identical": all(o.tokens == plain.tokens for o in outputs.values()),
            **{f"{name}_tps": statistics.median(v) for name, v in speed.items()},
            "accepted_prediction_tokens": outputs["predicted"].stats.accepted_prediction_tokens,
            "rejected_prediction_tokens": outputs["predicted"].stats.rejected_prediction_tokens,
            "predicted_passes": outputs["predicted"].stats.target_passes,
            "drafted_by_kind": {name: o.stats.drafted_by_kind for name, o in outputs.items()},
        }
        row["predicted_vs_drafter"] = row["predicted_tps"] / row["drafter_tps"]
        perfect_tps = row["tokens"] / (-(-row["tokens"] // (k + 1)) * costs[k + 1])
        row["bound_vs_drafter"] = perfect_tps / row["drafter_tps"]
        row["predicted_vs_plain"] = row["predicted_tps"] / row["plain_tps"]
        row["drafter_vs_plain"] = row["drafter_tps"] / row["plain_tps"]
        rows.append(row)
        print(f"{row['id']:28} {row['tokens']:4d} tok  plain {row['plain_tps']:5.2f}  drafter "
              f"{row['drafter_tps']:5.2f}  predicted {row['predicted_tps']:5.2f} tok/s  "
              f"x{row['predicted_vs_drafter']:.2f} vs drafter, x{row['predicted_vs_plain']:.2f} "
              f"vs plain  prediction +{row['accepted_prediction_tokens']}/"
              f"-{row['rejected_prediction_tokens']}  bound x{row['bound_vs_drafter']:.2f} vs "
              f"drafter  identical={row['identical']}", flush=True)
    engine.close()
    for key in ("predicted_vs_drafter", "bound_vs_drafter", "predicted_vs_plain",
                "drafter_vs_plain"):
        values = [row[key] for row in rows]
        worst = min(rows, key=lambda row: row[key])
        print(f"{key}: median x{statistics.median(values):.2f}, worst x{worst[key]:.2f} "
              f"({worst['id']})")
    print(f"identical outputs: {sum(row['identical'] for row in rows)}/{len(rows)}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
