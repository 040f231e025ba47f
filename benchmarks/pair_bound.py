"""What a draft model can win on this machine: the bound in docs/measurements/real-pair.md.

    python benchmarks/pair_bound.py [--pair qwen2.5-coder-1.5b] [--limit 2] [--max-tokens 128]
                                    [--threads N]

One process, nothing else running. Measured:
- the target's pass cost by rows, V(r) (``Engine.pass_seconds``), and the draft model's, D(r),
  with the draft model loaded as a target of its own: D(1) is one drafted token, D(n) the first
  draft pass of a step that catches up n tokens the draft model has not seen;
- per built-in prompt (chat-templated, greedy): the target's plain output, then the draft
  model's greedy guess at every position of it given the true prefix, in one teacher-forced
  pass; run[i] = how many of its guesses from position i on are the target's tokens.

A greedy draft of k tokens at position i is accepted min(run[i], k) long, and its step emits
that plus one token. The draft model's cache lags the history by the tokens emitted since it
last drafted (1 or 2 in a run of drafting steps), so a step costs D(lag + 1) + (k - 1) D(1) +
V(k + 1). Replayed over each output against plain decoding's V(1) a token:
- ``k=K``: a draft of K tokens at every step;
- ``oracle``: each step drafts exactly what will be accepted (run[i], at most 8) or nothing,
  whichever costs less per token, knowing the catch-up it pays: a controller cannot beat it;
- ``perfect``: every drafted token accepted (run = infinity), the best fixed k.
The ratios are upper bounds for the draft model on this machine: they leave out everything but
the passes (sampling, bookkeeping, the controller's probes).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence

import numpy as np

from localspec.bench.prompts import BUILTIN_CATEGORIES, load_prompts
from localspec.models.registry import resolve_pair
from localspec.runtime.engine import Engine
from localspec.text.chat_template import chat_format, chat_tokens
from localspec.types import GenerationParams

MAX_ROWS = 16  # pass costs measured up to this many rows; longer catch-ups are extrapolated
MAX_DRAFT = 8


def pass_costs(engine: Engine, context: list[int], repeats: int = 5) -> list[float]:
    """Median seconds of a pass by rows (index r), two interleaved measurements."""
    runs = [engine.pass_seconds(context, MAX_ROWS, repeats=repeats) for _ in range(2)]
    return [statistics.median(pair) for pair in zip(*runs, strict=True)]


def cost(table: Sequence[float], rows: int) -> float:
    """A pass of ``rows`` rows; beyond the table, its last per-row slope."""
    if rows < len(table):
        return table[rows]
    slope = (table[-1] - table[len(table) // 2]) / (len(table) - 1 - len(table) // 2)
    return table[-1] + slope * (rows - len(table) + 1)


def runs_of_agreement(guesses: np.ndarray, output: Sequence[int]) -> list[int]:
    """run[i]: how many consecutive draft guesses from output position i match the target."""
    match = [int(g == t) for g, t in zip(guesses, output, strict=True)]
    run = [0] * (len(match) + 1)
    for i in range(len(match) - 1, -1, -1):
        run[i] = run[i + 1] + 1 if match[i] else 0
    return run[:-1]


def replay(run: Sequence[int], verify: Sequence[float], draft: Sequence[float],
           choose: str | int) -> float:
    """Seconds to emit the output by the rule ``choose`` (k, "oracle" or "perfect:k")."""
    i, lag, seconds = 0, 1, 0.0
    while i < len(run):
        r = run[i] if not (isinstance(choose, str) and choose.startswith("perfect")) else 1 << 30
        if isinstance(choose, int):
            k = choose
        elif choose == "oracle":
            k = min(r, MAX_DRAFT)
            if k > 0:
                spend = cost(draft, lag) + (k - 1) * draft[1] + cost(verify, k + 1)
                if spend / (k + 1) >= verify[1]:
                    k = 0
        else:
            k = int(choose.split(":")[1])
        k = min(k, len(run) - i - 1)
        if k <= 0:
            seconds += verify[1]
            i += 1
            lag += 1
            continue
        accepted = min(r, k)
        seconds += cost(draft, lag) + (k - 1) * draft[1] + cost(verify, k + 1)
        i += accepted + 1
        lag = 2 if accepted == k else 1
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="qwen2.5-coder-1.5b")
    parser.add_argument("--limit", type=int, default=2, help="prompts per category")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    pair = resolve_pair(args.pair, download=False)
    if pair.drafter.path is None:
        raise SystemExit(f"the pair {args.pair} has no draft model")
    threads = {"n_threads": args.threads} if args.threads else {}
    prompts = load_prompts(None, BUILTIN_CATEGORIES, args.limit)
    params = GenerationParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True,
                              speculative=False, reuse_cache=False)
    outputs: list[tuple[str, list[int], list[int]]] = []
    with Engine.load(pair.target, "none", n_ctx=4096, **threads) as target:
        form = chat_format(target.info.chat_template, pair.chat_template, pair.stop)
        for p in prompts:
            tokens = chat_tokens(form.template, [{"role": "user", "content": p.text}],
                                 target.info, target.tokenize)
            outputs.append((p.category, tokens, list(target.generate(tokens, params).tokens)))
        verify = pass_costs(target, outputs[0][1])
    runs: list[tuple[str, list[int]]] = []
    with Engine.load(pair.drafter.path, "none", n_ctx=4096, **threads) as drafter:
        for category, prompt, output in outputs:
            logits = drafter.pass_logits(prompt + output[:-1], len(output))
            runs.append((category, runs_of_agreement(logits.argmax(axis=1), output)))
        draft = pass_costs(drafter, outputs[0][1])
    for name, table in (("target", verify), ("draft", draft)):
        shown = " ".join(f"{r}:{s * 1e3:.1f}" for r, s in enumerate(table) if r)
        print(f"{name} pass ms by rows:", shown)
    print(f"c = D(1) / V(1) = {draft[1] / verify[1]:.2f}")
    rules: list[str | int] = [*range(1, 5), "oracle", *(f"perfect:{k}" for k in range(1, 9))]
    names = [f"k={r}" if isinstance(r, int) else r for r in rules[:5]]
    print(f"{'category':<14}{'accept':>7}" + "".join(f"{n:>8}" for n in names) + f"{'perfect':>9}")
    categories = list(dict.fromkeys(c for c, _ in runs))
    for category in [*categories, "all"]:
        chosen = [run for c, run in runs if category in (c, "all")]
        plain = sum(len(run) * verify[1] for run in chosen)
        ratios = [plain / sum(replay(run, verify, draft, rule) for run in chosen) for rule in rules]
        accept = statistics.mean(x > 0 for run in chosen for x in run)
        print(f"{category:<14}{accept:>7.2f}" + "".join(f"{x:>8.2f}" for x in ratios[:5])
              + f"{max(ratios[5:]):>9.2f}")


if __name__ == "__main__":
    main()
