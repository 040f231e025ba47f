"""`localspec run`: generate once from a prompt, streaming text or printing one JSON object."""

from __future__ import annotations

import argparse
import json
import sys

from localspec.commands.common import add_model_arguments, choose_models, draft_max_arg, load_engine
from localspec.engine import Engine
from localspec.errors import InvalidParameterError
from localspec.learned import LearnedKey, learned_path, load_learned, save_learned
from localspec.types import GenerationParams, GenerationStats


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "run",
        help="generate text from a prompt",
        description="Generate from PROMPT ('-' reads standard input) with speculative decoding.",
    )
    parser.add_argument("prompt", help="the prompt text, or - to read it from standard input")
    add_model_arguments(parser, pair_option=True)
    parser.add_argument(
        "--draft-max", type=draft_max_arg, default=None, help="longest draft per step, or auto"
    )
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--temperature", type=float, default=None, help="0 = greedy (default: the pair's, else 0.8)"
    )
    parser.add_argument("--top-k", type=int, default=40)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--min-p", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument(
        "--ignore-eos", action="store_true", help="generate exactly --max-tokens tokens"
    )
    parser.add_argument("--no-speculation", action="store_true", help="plain target-only decoding")
    parser.add_argument(
        "--reset-stats", action="store_true",
        help="start the draft controller from nothing instead of the statistics saved by earlier "
        "runs of this model + drafter (they are overwritten at the end)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (schema in README)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    prompt = _read_stdin() if args.prompt == "-" else args.prompt
    choice = choose_models(args)
    temperature = args.temperature
    if temperature is None:
        temperature = choice.temperature if choice.temperature is not None else 0.8
    params = GenerationParams(
        max_tokens=args.max_tokens,
        temperature=temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
        stop=tuple(args.stop),
        draft_max=args.draft_max if args.draft_max is not None else choice.draft_max,
        speculative=not args.no_speculation,
        ignore_eos=args.ignore_eos,
    )
    params.validate()  # before the (slow) model load
    with load_engine(args, choice) as engine:
        stats_path = learned_path(LearnedKey.of(engine.options))
        saved = None if args.reset_stats else load_learned(stats_path)
        if saved is not None:
            engine.restore_learned(saved)
        try:
            return _generate(args, engine, prompt, params, used_saved=saved is not None)
        finally:
            if params.speculative:
                save_learned(stats_path, engine.learned())


def _generate(args: argparse.Namespace, engine: Engine, prompt: str, params: GenerationParams,
              *, used_saved: bool) -> int:
    if args.json:
        result = engine.generate(prompt, params)
        print(json.dumps({**result.to_dict(), "saved_stats_used": used_saved}, ensure_ascii=False))
        return 0
    handle = engine.submit(prompt, params)
    try:
        for chunk in handle:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    finally:
        handle.cancel()  # Ctrl-C: stop the engine within one step
    sys.stdout.write("\n")
    sys.stdout.flush()
    print(summary_line(handle.result().stats, engine.info.drafter), file=sys.stderr)
    return 0


def _read_stdin() -> str:
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidParameterError(
            f"Standard input is not valid UTF-8 text (byte {data[error.start]:#04x} at offset "
            f"{error.start}); convert it to UTF-8 first, e.g. with iconv."
        ) from None


def summary_line(stats: GenerationStats, drafter: str) -> str:
    return (
        f"[{stats.n_tokens} tokens, {stats.tokens_per_second:.1f} tok/s | drafter {drafter}: "
        f"drafted {stats.drafted}, accepted {stats.accepted} "
        f"({stats.acceptance_rate:.0%}), mean accepted length {stats.mean_accepted_length:.2f}, "
        f"{stats.target_passes} target passes]"
    )
