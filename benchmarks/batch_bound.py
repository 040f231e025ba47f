"""How far batching can go on this machine: the bound in docs/measurements/batched-serving.md
("At stop 45").

    python benchmarks/batch_bound.py [--clients 4] [--max-tokens 128] [--rounds 4]

One process, the default pair (n-gram drafts), the first ``clients`` bench prompts. Rounds take
turns between three measurements:
- ``parallel=1``: the prompts one after the other (what ``serve --parallel 1`` does);
- the prompts' prefill alone (a 1-token answer each, less one 1-row pass);
- ``parallel=clients``: the prompts at once.
Then pass costs by rows (``Engine.pass_seconds``). The bound gives the batch perfect drafts:
every drafted token accepted, so a pass of r rows emits r tokens, at the cheapest cost per row
over passes of ``clients``, 2 x ``clients``, ... rows. The first round holds the start-up
calibration, so the medians leave it out.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from localspec.bench.prompts import load_prompts
from localspec.models.registry import resolve_pair
from localspec.runtime.engine import Engine
from localspec.types import GenerationParams

MAX_ROWS = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    texts = [p.text for p in load_prompts(None)[: args.clients]]
    params = GenerationParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True,
                              reuse_cache=False)
    one, prefill, many = [], [], []
    with Engine.load(resolve_pair(download=False).target, "ngram",
                     parallel=args.clients) as engine:
        print("prompt tokens:", [len(engine.tokenize(t)) for t in texts])
        for round_ in range(args.rounds):
            start = time.perf_counter()
            tokens = sum(len(engine.generate(t, params).tokens) for t in texts)
            one.append(tokens / (time.perf_counter() - start))
            start = time.perf_counter()
            for t in texts:
                engine.generate(t, replace(params, max_tokens=1))
            prefill.append(time.perf_counter() - start)
            start = time.perf_counter()
            handles = [engine.submit(t, params) for t in texts]
            tokens = sum(len(h.result().tokens) for h in handles)
            many.append(tokens / (time.perf_counter() - start))
            print(f"round {round_ + 1}: parallel=1 {one[-1]:.1f} tokens/s, prefill "
                  f"{prefill[-1] * 1000:.0f} ms, parallel={args.clients} {many[-1]:.1f} tokens/s",
                  flush=True)
        runs = [engine.pass_seconds(engine.tokenize(texts[0]), MAX_ROWS, repeats=7)
                for _ in range(2)]
    passes = [statistics.median(pair) for pair in zip(*runs, strict=True)]
    print("pass ms by rows:", " ".join(f"{r}:{s * 1000:.1f}" for r, s in enumerate(passes) if r))
    per_row = min(passes[r] / r for r in range(args.clients, MAX_ROWS + 1, args.clients))
    kept = slice(1, None) if args.rounds > 1 else slice(None)
    read = statistics.median(prefill[kept]) - args.clients * passes[1]
    p1, pn = statistics.median(one[kept]), statistics.median(many[kept])
    total = args.clients * args.max_tokens
    best = total / (read + total * per_row)
    print(f"perfect drafts: {per_row * 1000:.2f} ms a row; parallel={args.clients} at most "
          f"{best:.1f} tokens/s = {best / p1:.2f}x parallel=1 ({p1:.1f}); measured {pn:.1f} = "
          f"{pn / p1:.2f}x")


if __name__ == "__main__":
    main()
