"""A busy machine (issue 52's measured goals): the default thread count against fixed ones, and
"auto" against plain decoding, on a quiet CPU and with two busy loops on it.

Table 1: `localspec run` (the embedded Gemma, n-gram drafter, draft length auto, fresh
controller statistics) with the default thread count, --threads 1 and --threads 2, in turns,
each a fresh process; tokens/s, medians of --rounds. Goal: the default within 10% of the best
fixed count, quiet and busy.

Table 2: in one engine per setup, plain decoding and "auto" in turns on the same prompt
(tokens/s: medians of --rounds; the ratio: the median of each round's auto / plain, next to
plain again / plain, the A/A that says how much this machine's noise is): the
embedded Gemma with a random EAGLE-3 head (a useless drafter) and the real pair (the
Qwen2.5-Coder 1.5B drafted by its 0.5B; skipped where it does not resolve). Goal: auto >= 0.97x
plain, quiet and busy; the tokens the drafter drafted are shown.

"Busy" starts two `python -c "while True: pass"` processes and waits --settle seconds (the
default thread count measures the CPUs at start-up; the wait only lets the loops start). Run it
alone on the machine:

    python benchmarks/threads.py [--rounds 3] [--max-tokens 128] [--settle 5] [--skip-pair]
                                 [--pair-only]

--pair-only runs table 2's real-pair row alone (more rounds of it in the same time).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from localspec.models.gguf_reader import read_gguf
from localspec.models.registry import load_registry
from localspec.runtime.engine import Engine
from localspec.runtime.threads import default_threads, system_load
from localspec.testing.heads import HeadSpec, write_eagle3_head
from localspec.types import GenerationParams

PROMPTS = [
    "The history of the printing press begins",
    "def parse_config(path):\n    \"\"\"Read a TOML file and",
    "Here is a short story about a lighthouse keeper:",
]
PAIR = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")


@contextlib.contextmanager
def busy_loops(n: int, settle: float) -> Iterator[None]:
    """``n`` processes spinning on a core each, for the body's duration."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        if n:
            time.sleep(settle)
        yield
    finally:
        for loop in loops:
            loop.kill()
        for loop in loops:
            loop.wait()


def cli_rate(prompt: str, threads: int | None, max_tokens: int) -> tuple[float, int]:
    """One `localspec run --json` (fresh statistics): (tokens/s, threads it ran with)."""
    args = [sys.executable, "-m", "localspec.cli", "run", prompt, "--json", "--reset-stats",
            "--temperature", "0", "--ignore-eos", "--max-tokens", str(max_tokens)]
    if threads is not None:
        args += ["--threads", str(threads)]
    with tempfile.TemporaryDirectory() as cache:  # nothing saved reaches the next arm
        env = {**os.environ, "LOCALSPEC_CACHE_DIR": cache}
        models = Path(load_registry().resolve_pair().target)
        (Path(cache) / "models").mkdir()
        (Path(cache) / "models" / models.name).symlink_to(models)
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    out = json.loads(proc.stdout)
    return out["stats"]["tokens_per_second"], out.get("threads", 0)


def threads_table(rounds: int, max_tokens: int) -> list[str]:
    arms: list[int | None] = [None, 1, 2]
    rates: dict[int | None, list[float]] = {arm: [] for arm in arms}
    chosen: list[int] = []
    for r in range(rounds):
        for arm in arms[r % 3:] + arms[:r % 3]:  # rotated: drift hits every arm alike
            rate, used = cli_rate(PROMPTS[r % len(PROMPTS)], arm, max_tokens)
            rates[arm].append(rate)
            if arm is None:
                chosen.append(used)
    best = max(statistics.median(rates[1]), statistics.median(rates[2]))
    default = statistics.median(rates[None])
    return [f"| default ({'/'.join(map(str, chosen))} threads) | {default:.2f} | "
            f"{default / best:.2f}x of the best fixed |",
            f"| --threads 1 | {statistics.median(rates[1]):.2f} | |",
            f"| --threads 2 | {statistics.median(rates[2]):.2f} | |"]


def random_head(target: Path, folder: Path) -> Path:
    info = read_gguf(target, read_arrays=False)
    spec = HeadSpec(n_embd=info.n_embd, n_head=4, n_head_kv=2, n_ff=2 * info.n_embd,
                    draft_vocab=4096, seed=1)
    return write_eagle3_head(folder / "random-head.gguf", target, spec)


def auto_table(setups: list[tuple[str, Path, str]], rounds: int, max_tokens: int) -> list[str]:
    """Per round, one prompt: plain, auto and plain again (A/A), in rotated order."""
    lines = []
    for name, target, drafter in setups:
        with Engine.load(target, draft=drafter, n_ctx=2048) as engine:
            params = GenerationParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                      draft_max="auto")
            rates: dict[str, list[float]] = {"plain": [], "auto": [], "plain again": []}
            by_model, drafted, accepted = 0, 0, 0
            arms = list(rates)
            for r in range(rounds):
                prompt = PROMPTS[r % len(PROMPTS)]
                for arm in arms[r % 3:] + arms[:r % 3]:  # rotated: drift hits every arm alike
                    result = engine.generate(prompt, params, speculative=arm == "auto",
                                             reuse_cache=False)
                    rates[arm].append(result.stats.tokens_per_second)
                    if arm == "auto":
                        by_model += result.stats.model_drafted
                        drafted += result.stats.drafted
                        accepted += result.stats.accepted
            # A round's arms ran the same prompt back to back: their ratios are paired, so a
            # round's load or a prompt's speed cancels out of them. A/A (plain again / plain)
            # is the spread this machine shows between two identical arms.
            paired = statistics.median(a / p for a, p in zip(rates["auto"], rates["plain"],
                                                             strict=True))
            aa = statistics.median(a / p for a, p in zip(rates["plain again"], rates["plain"],
                                                         strict=True))
            plain, auto = statistics.median(rates["plain"]), statistics.median(rates["auto"])
            lines.append(f"| {name} ({engine.options.n_threads} threads) | {plain:.2f} | "
                         f"{auto:.2f} | {paired:.2f}x | {aa:.2f}x | {by_model} by the model; "
                         f"all drafters {drafted} drafted, {accepted} accepted |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds the busy loops run before measuring (load average)")
    parser.add_argument("--skip-pair", action="store_true", help="only the embedded Gemma")
    parser.add_argument("--pair-only", action="store_true",
                        help="only the real pair's row of table 2 (no table 1, no Gemma head)")
    args = parser.parse_args()
    registry = load_registry()
    gemma = Path(registry.resolve_pair().target)
    with tempfile.TemporaryDirectory() as folder:
        setups = [] if args.pair_only else [("embedded Gemma + random EAGLE-3 head", gemma,
                                             f"eagle3:{random_head(gemma, Path(folder))}")]
        if not args.skip_pair:
            try:
                target, draft = (Path(registry.resolve_model(name)) for name in PAIR)
                setups.append(("Qwen2.5-Coder 1.5B + 0.5B", target, str(draft)))
            except Exception as error:  # noqa: BLE001 - a missing pair is a skipped row
                print(f"(the real pair is skipped: {error})")
        for label, loops in (("quiet", 0), ("two busy loops", 2)):
            with busy_loops(loops, args.settle):
                print(f"\n## {label} (load average {system_load()}, default threads "
                      f"{default_threads()})\n")
                if not args.pair_only:
                    print("| threads | tokens/s (median) | |\n|---|---|---|")
                    print("\n".join(threads_table(args.rounds, args.max_tokens)))
                print("\n| setup | plain tok/s | auto tok/s | auto / plain (paired) | A/A | "
                      "drafter |\n"
                      "|---|---|---|---|---|---|")
                print("\n".join(auto_table(setups, args.rounds, args.max_tokens)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
