"""Measure a GPU backend on generated models of realistic width (the tables in docs/gpu.md).

    python benchmarks/gpu_measure.py [--out DIR] [--width 2048] [--layers 8] [--json FILE]

For each weight type (Q4_K_M, Q8_0, F16) and each mode (default, exact), on every layer the
backend can hold (n_gpu_layers -1):
- the cost of one greedy verification pass of r rows, r = 1 .. 16, over that of 1 row
  (Engine.pass_seconds: the median of 5). Batched serving and the controller's k choice rest
  on this curve: flat on a GPU, rising by rows on a CPU;
- the row counts whose pass gives any row other logits bits than single-token passes at the
  same positions (localspec.bench.invariance), at a 48- and a 600-token context: what exact mode
  would have to remove on this backend.
The models are random weights (localspec.testing.synthetic), so tokens/s from them say nothing about
acceptance; the pass costs and bits do not depend on what the weights say.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from exact_measure import rows_text  # benchmarks/, beside this script

TYPES = ("Q4_K_M", "Q8_0", "F16")
ROWS_SHOWN = (2, 4, 8, 16)


def write_models(out: Path, width: int, layers: int) -> dict[str, Path]:
    from localspec import _core
    from localspec.testing.synthetic import TinyConfig, write_model

    f32 = out / f"gpu-{width}x{layers}-f32.gguf"
    if not f32.exists():
        cfg = TinyConfig(n_embd=width, n_head=width // 128, n_head_kv=width // 256,
                         n_ff=width * 11 // 4 // 256 * 256, n_layer=layers,
                         extra_tokens=32000, seed=7)
        write_model(f32, cfg)
    models = {}
    for qtype in TYPES:
        models[qtype] = out / f"gpu-{width}x{layers}-{qtype}.gguf"
        if not models[qtype].exists():
            _core.quantize(str(f32), str(models[qtype]), qtype, 8)
    return models


def measure(path: Path, exact: bool) -> dict[str, Any]:
    from localspec.bench.invariance import differing_row_counts
    from localspec.bench.prompts import load_prompts
    from localspec.runtime.engine import Engine

    with Engine.load(path, "none", n_ctx=2048, exact=exact) as engine:
        text = " ".join(p.text for p in load_prompts(limit_per_category=1)) * 4
        tokens = engine.tokenize(text)
        seconds = engine.pass_seconds(tokens[:600], 16)
        return {"head": engine.info.verify_head, "exact": engine.info.exact,
                "pass_seconds": seconds,
                "differs": [differing_row_counts(engine, tokens[:n]) for n in (48, 600)]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/localspec-gpu", help="where the models go")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--json", help="also write every number to this file")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    models = write_models(out, args.width, args.layers)
    print(f"models written in {time.monotonic() - started:.0f} s", flush=True)
    shown = " | ".join(f"{r} rows" for r in ROWS_SHOWN)
    print(f"| model | mode | 1-row pass (ms) | {shown} | rows differing, 48 ctx | 600 ctx |")
    print("|---|---|---|" + "---|" * len(ROWS_SHOWN) + "---|---|")
    results = {}
    for qtype, path in models.items():
        for exact in (False, True):
            result = measure(path, exact)
            results[f"{qtype} {'exact' if exact else 'default'}"] = result
            s = result["pass_seconds"]
            ratios = " | ".join(f"{s[r] / s[1]:.2f}x" for r in ROWS_SHOWN)
            short, long = result["differs"]
            print(f"| {args.width}-wide {args.layers}-layer {qtype} | "
                  f"{'exact' if exact else 'default'} | {s[1] * 1e3:.2f} | {ratios} | "
                  f"{rows_text(short)} | {rows_text(long)} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
