"""Does one client's grammar slow or change the others' streams? (issue 48's measured goal)

Three greedy streams run together on one engine (--parallel 4), in four arms taken in turns:
alone; beside a fourth plain stream; beside a fourth stream under the costliest grammar the
default limits accept (at most 1,024 alternatives); beside a fourth whose grammar is done after
its first token (`<[0]>`: then only the end of generation may follow, which ignore_eos keeps
emitting, each row shaped by the grammar). Each arm's streams must give their solo outputs;
their tokens/s are reported as a ratio to the "alone" arm (median of the rounds), with the
worst stream. (A grammar that fails inside a step on this model's vocabulary is refused when
checked; tests/core/test_isolation.py runs one on the tiny model.)

    python benchmarks/grammar_isolation.py [--target GGUF] [--rounds 3] [--max-tokens 96] [--exact]

In default mode a batched pass may sum in another order than a solo one, so the streams' greedy
outputs can part at near-ties, and with them their n-gram drafts and speeds; --exact (docs/
exact.md) keeps every arm's outputs bit-identical, so the ratios measure the interference alone.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from localspec.errors import LocalspecError
from localspec.models.registry import load_registry
from localspec.runtime.engine import Engine
from localspec.text.grammar_check import DEFAULT_LIMITS
from localspec.types import GenerationParams

PROMPTS = [
    "The history of the printing press begins",
    "def parse_config(path):\n    \"\"\"Read a TOML file and",
    "Here is a short story about a lighthouse keeper:",
]
FOURTH = "Write a list of fruits:"


def words_grammar(n: int) -> str:
    words = " | ".join(f'"w{i}"' for i in range(n))
    return f"root ::= word (\" \" word)*\nword ::= {words}\n"


def costly_grammar(engine: Engine) -> str:
    """The costliest word-list grammar the default limits accept (branches and the timed mask
    of the whole vocabulary, Engine.check_grammar): a word from the list, then more words."""
    for n in (1024, 768, 512, 384, 256, 192, 128, 96, 64, 48, 32, 16):
        try:
            engine.check_grammar(words_grammar(n), DEFAULT_LIMITS)
        except LocalspecError:
            continue
        print(f"the costliest accepted grammar: {n} words")
        return words_grammar(n)
    raise SystemExit("no word-list grammar passes the default limits")


def run_arm(engine: Engine, params: GenerationParams, fourth: GenerationParams | None
            ) -> tuple[list[list[int]], list[float], str]:
    handles = [engine.submit(p, params) for p in PROMPTS]
    extra = engine.submit(FOURTH, fourth) if fourth is not None else None
    results = [h.result(timeout=600) for h in handles]
    note = ""
    if extra is not None:
        try:
            extra.result(timeout=600)
        except LocalspecError as error:
            note = str(error)[:80]
    speeds = [r.stats.n_tokens / r.stats.generation_seconds for r in results]
    return [r.tokens for r in results], speeds, note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", help="target GGUF (default: the default pair's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--exact", action="store_true", help="exact mode in every engine")
    args = parser.parse_args()
    target = args.target or str(load_registry().resolve_pair().target)
    params = GenerationParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    with Engine.load(target, draft="none", n_threads=1, exact=args.exact) as solo:
        expected = [solo.generate(p, params).tokens for p in PROMPTS]
        costly = costly_grammar(solo)
    arms = {
        "alone": None,
        "beside a plain stream": params,
        "beside the costliest accepted grammar": replace(params, grammar=costly),
        "beside a grammar done after one token": replace(params, grammar="root ::= <[0]>"),
    }
    speeds: dict[str, list[list[float]]] = {name: [] for name in arms}
    identical = {name: True for name in arms}
    notes: dict[str, str] = {}
    with Engine.load(target, draft="ngram", n_threads=args.threads, parallel=4,
                     exact=args.exact) as engine:
        engine.warm_up()
        for _ in range(args.rounds):
            for name, fourth in arms.items():
                tokens, per_stream, note = run_arm(engine, params, fourth)
                identical[name] &= tokens == expected
                speeds[name].append(per_stream)
                notes[name] = note or notes.get(name, "")
    base = [statistics.median(r[i] for r in speeds["alone"]) for i in range(len(PROMPTS))]
    mode = "exact mode" if args.exact else "default mode"
    print(f"target {target}, {args.rounds} rounds, {args.max_tokens} tokens, greedy, {mode}\n")
    print("| arm | identical to solo | tokens/s ratio per stream (median) | worst | the 4th |")
    print("|---|---|---|---|---|")
    for name in arms:
        ratios = [statistics.median(r[i] for r in speeds[name]) / base[i]
                  for i in range(len(PROMPTS))]
        cells = ", ".join(f"{x:.2f}" for x in ratios)
        print(f"| {name} | {'yes' if identical[name] else 'NO'} | {cells} | {min(ratios):.2f} "
              f"| {notes.get(name) or '-'} |")


if __name__ == "__main__":
    main()
