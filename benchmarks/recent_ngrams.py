"""Recent outputs across requests (issue 49, item 5): does looking up the latest answers pay on a
workload that repeats itself?

The workload: coding questions, each asked twice in other words (an agent's retry, a user's
rephrasing), in a fixed order, every request through the chat template, greedy. Two engines
over the same models, one with ``recent_ngram_tokens`` and one without; each request runs on
both, back to back, alternating which goes first. Printed per request: tokens/s of each, the
ratio, the drafts accepted, and whether the answers (their text) are identical; then the median
and worst ratio over the second askings (where the recent answers can help) and over the first ones
(where they can only cost).

    python benchmarks/recent_ngrams.py                          # the embedded default model
    python benchmarks/recent_ngrams.py --pair qwen2.5-coder-1.5b --max-tokens 128
"""

from __future__ import annotations

import argparse
import statistics
import sys

from localspec.models.registry import resolve_pair
from localspec.runtime.engine import Engine
from localspec.text.chat_template import chat_format, chat_tokens
from localspec.types import GenerationParams

QUESTIONS = [
    ("Write a Python function that returns the n-th Fibonacci number, with type hints and a "
     "docstring.",
     "Please write a Python function, with type hints and a docstring, returning the n-th "
     "Fibonacci number."),
    ("Write a Python function that checks whether a string is a palindrome, with type hints "
     "and a docstring.",
     "Please write a typed, documented Python function that tells whether a string is a "
     "palindrome."),
    ("Write a Python function that reads a JSON file and returns its contents as a dict, with "
     "error handling.",
     "Please write a Python function that loads a JSON file into a dict and handles errors."),
    ("Write a Python class for a stack with push, pop and peek methods, with docstrings.",
     "Please write a Python Stack class (push, pop, peek) with docstrings."),
    ("Write a Python function that counts the words in a text file, with type hints and a "
     "docstring.",
     "Please write a typed, documented Python function counting the words of a text file."),
    ("Write a Python function that merges two sorted lists into one sorted list, with type "
     "hints and a docstring.",
     "Please write a Python function, typed and documented, that merges two sorted lists."),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default=None, help="a models.toml pair (default: the embedded)")
    parser.add_argument("--draft", default="ngram")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--recent-tokens", type=int, default=32768)
    parser.add_argument("--exact", action="store_true",
                        help="exact mode: outputs bit-identical whatever the drafts "
                        "(docs/exact.md)")
    args = parser.parse_args(argv)

    pair = resolve_pair(args.pair, download=False)
    engines = {
        "off": Engine.load(pair.target, args.draft, n_ctx=2048, exact=args.exact),
        "on": Engine.load(pair.target, args.draft, n_ctx=2048, exact=args.exact,
                          recent_ngram_tokens=args.recent_tokens),
    }
    info = engines["off"].info
    template = chat_format(info.chat_template, pair.chat_template, pair.stop)
    params = GenerationParams(temperature=0.0, max_tokens=args.max_tokens, seed=0,
                              reuse_cache=False, stop=template.stop)
    print(f"# {info.target_name}, drafter {info.drafter}, {len(QUESTIONS)} questions asked "
          f"twice, at most {args.max_tokens} tokens, recent outputs {args.recent_tokens} tokens",
          file=sys.stderr)
    for engine in engines.values():  # warm-up: nothing stored that the workload asks
        engine.generate(chat_tokens(template.template, [{"role": "user", "content": "Hi"}], info,
                                    engine.tokenize), params)
    ratios: dict[str, list[tuple[float, str]]] = {"first": [], "second": []}
    identical = 0
    order = [(q, "first", i) for i, (q, _) in enumerate(QUESTIONS)]
    order += [(q, "second", i) for i, (_, q) in enumerate(QUESTIONS)]
    for n, (question, asking, i) in enumerate(order):
        tokens = chat_tokens(template.template, [{"role": "user", "content": question}], info,
                             engines["off"].tokenize)
        arms = ["off", "on"] if n % 2 == 0 else ["on", "off"]
        results = {arm: engines[arm].generate(tokens, params) for arm in arms}
        off, on = results["off"], results["on"]
        ratio = on.stats.tokens_per_second / off.stats.tokens_per_second
        ratios[asking].append((ratio, f"q{i}-{asking}"))
        # The text is the answer; tokens after a stop string depend on where the step ended.
        same = off.text == on.text
        identical += same
        print(f"q{i}-{asking:6} {off.stats.n_tokens:4d} tok  off {off.stats.tokens_per_second:6.1f}"
              f"  on {on.stats.tokens_per_second:6.1f} tok/s  x{ratio:.2f}  accepted "
              f"{off.stats.accepted} -> {on.stats.accepted}  identical={same}",
              flush=True)
    for asking, values in ratios.items():
        worst = min(values)
        print(f"{asking} askings: median x{statistics.median(v for v, _ in values):.2f}, worst "
              f"x{worst[0]:.2f} ({worst[1]})")
    print(f"identical outputs: {identical}/{len(order)}")
    for engine in engines.values():
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
