"""`localspec run`: generate once from a prompt, streaming text or printing one JSON object.

``--chat`` sends the prompt as one user turn (after ``--system``) through the chat template (the
pair's from models.toml, else the GGUF's, else ChatML), so an instruct model answers it.
``--fim-prefix FILE`` / ``--fim-suffix FILE`` (and ``--fim-extra FILE``, repeatable) fill in the
middle between two files' text with the model's FIM tokens, as ``POST /infill`` does; PROMPT is
then optional: text typed after the prefix.
Ctrl+C stops the generation within one step, ends the line and prints the stats so far.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import threading
from dataclasses import asdict, replace
from types import FrameType
from typing import Any

from localspec.commands.common import (
    ModelChoice,
    add_draft_max_argument,
    add_model_arguments,
    add_speculation_switch,
    choose_models,
    load_engine,
)
from localspec.commands.limits import limit_notes
from localspec.commands.shaping import add_shaping_arguments, shaping_fields
from localspec.errors import InvalidParameterError
from localspec.files import read_input_text
from localspec.runtime.engine import Engine
from localspec.runtime.learned import SavedStats, restore_saved, save_learned, saved_path
from localspec.runtime.threads import slow_run_note
from localspec.text.chat_template import chat_format, chat_tokens
from localspec.text.fim import ExtraChunk, FimInput, model_fim_prompt
from localspec.types import GenerationParams, GenerationResult, GenerationStats

INTERRUPTED = 130  # the shell's code for a process ended by Ctrl+C


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "run",
        help="generate text from a prompt",
        description="Generate from PROMPT ('-' reads standard input) with speculative decoding.",
    )
    parser.add_argument("prompt", nargs="?",
                        help="the prompt text, or - to read it from standard input (with "
                        "--fim-*: optional text typed after the prefix)")
    add_model_arguments(parser)
    parser.add_argument(
        "--chat", action="store_true",
        help="send PROMPT as a user message through the model's chat template (default: as raw "
        "text)",
    )
    parser.add_argument("--system", help="a system message (with --chat; default: none)")
    parser.add_argument("--fim-prefix", metavar="FILE",
                        help="fill in the middle: the text before the gap (default: none)")
    parser.add_argument("--fim-suffix", metavar="FILE",
                        help="fill in the middle: the text after the gap (default: none)")
    parser.add_argument("--fim-extra", metavar="FILE", action="append", default=[],
                        help="fill in the middle: another file's text as context (repeatable; "
                        "default: none)")
    add_draft_max_argument(parser)
    parser.add_argument("--max-tokens", type=int, default=GenerationParams.max_tokens,
                        help="tokens to generate at most (default: %(default)s)")
    parser.add_argument(
        "--temperature", type=float, default=None, help="0 = greedy (default: the pair's, else 0.8)"
    )
    parser.add_argument("--top-k", type=int, default=GenerationParams.top_k,
                        help="sample from the K most likely tokens, 0: all (default: %(default)s)")
    parser.add_argument("--top-p", type=float, default=GenerationParams.top_p,
                        help="nucleus sampling threshold (default: %(default)s)")
    parser.add_argument("--min-p", type=float, default=GenerationParams.min_p,
                        help="drop tokens below this fraction of the top probability (default: "
                        "%(default)s)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: random, "
                        "shown by --json)")
    parser.add_argument("--stop", action="append", default=[],
                        help="stop string (repeatable; default: none)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="generate exactly --max-tokens tokens (default: stop at the end of "
                        "generation)")
    add_speculation_switch(parser)
    add_shaping_arguments(parser)
    parser.add_argument(
        "--prediction", metavar="FILE",
        help="Predicted Outputs: a file holding what the output probably is (the text before an "
        "edit); drafted from, the output unchanged ('-': standard input; default: none)",
    )
    parser.add_argument(
        "--reset-stats", action="store_true",
        help="start the draft controller from nothing instead of the statistics saved by earlier "
        "runs of this model + drafter (they are overwritten at the end; default: start from "
        "them)",
    )
    parser.add_argument(
        "--json", action="store_true",
        help="print one JSON object (schema in README; default: stream the text)"
    )
    parser.set_defaults(func=run)


def _params(args: argparse.Namespace, choice: ModelChoice) -> GenerationParams:
    defaults = choice.defaults()
    params = replace(
        defaults,
        max_tokens=args.max_tokens,
        temperature=defaults.temperature if args.temperature is None else args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        # a random seed is drawn here, not in the engine, so that --json can report it
        seed=args.seed if args.seed is not None else random.getrandbits(63),
        stop=tuple(args.stop),
        draft_max=defaults.draft_max if args.draft_max is None else args.draft_max,
        speculative=not args.no_speculation,
        ignore_eos=args.ignore_eos,
        prediction=_prediction(args),
        **shaping_fields(args),
    )
    params.validate()  # before the (slow) model load
    return params


def _prediction(args: argparse.Namespace) -> str | None:
    if args.prediction is None:
        return None
    if args.prediction == "-":
        if args.prompt == "-":
            raise InvalidParameterError("The prompt and --prediction cannot both come from "
                                        "standard input; give one of them as a file.")
        return _read_stdin()
    return read_input_text(args.prediction, "--prediction")


def _chat_prompt(engine: Engine, choice: ModelChoice, text: str, system: str | None,
                 params: GenerationParams) -> tuple[list[int], GenerationParams]:
    """The prompt as one user turn through the chat template, and the template's stop strings."""
    info = engine.info
    form = chat_format(info.chat_template, choice.chat_template, choice.stop)
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": text})
    tokens = chat_tokens(form.template, messages, info, engine.tokenize)
    return tokens, replace(params, stop=(*params.stop, *form.stop))


def _note(text: str) -> None:
    print(f"localspec: note: {text}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    if args.system is not None and not args.chat:
        raise InvalidParameterError("--system only applies to chat mode: add --chat, or write "
                                    "the instruction into the prompt.")
    fill = _fim_input(args)
    if args.prompt is None and fill is None:
        raise InvalidParameterError("Give a PROMPT (or - to read standard input), or a file to "
                                    "fill in the middle of with --fim-prefix / --fim-suffix.")
    text = _read_stdin() if args.prompt == "-" else args.prompt or ""
    if fill is not None:
        fill = replace(fill, prompt=text)
    choice = choose_models(args)
    params = _params(args, choice)
    with load_engine(args, choice) as engine:
        saved = None if args.reset_stats else restore_saved(engine)
        try:
            return _generate(args, engine, choice, text, params, saved=saved, fill=fill)
        finally:
            if params.speculative:
                save_learned(saved_path(engine), engine.learned())


def _fim_input(args: argparse.Namespace) -> FimInput | None:
    """The --fim-* files as a FIM request (None without them); checked before the model loads."""
    if args.fim_prefix is None and args.fim_suffix is None:
        if args.fim_extra:
            raise InvalidParameterError("--fim-extra is context for --fim-prefix / --fim-suffix; "
                                        "give one of them too.")
        return None
    if args.chat:
        raise InvalidParameterError("--fim-prefix / --fim-suffix fill in the middle of raw text; "
                                    "leave out --chat.")
    extra = tuple(ExtraChunk(path, _read_file("--fim-extra", path)) for path in args.fim_extra)
    prefix = _read_file("--fim-prefix", args.fim_prefix) if args.fim_prefix else ""
    suffix = _read_file("--fim-suffix", args.fim_suffix) if args.fim_suffix else ""
    return FimInput(prefix, suffix, extra=extra)


def _read_file(flag: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except OSError as error:
        raise InvalidParameterError(f"{flag} {path}: cannot read it ({error.strerror}).") from None
    except UnicodeDecodeError:
        raise InvalidParameterError(f"{flag} {path} is not UTF-8 text.") from None


def _generate(args: argparse.Namespace, engine: Engine, choice: ModelChoice, text: str,
              params: GenerationParams, *, saved: SavedStats | None,
              fill: FimInput | None = None) -> int:
    for note in limit_notes(args, choice.n_ctx, engine.info):
        _note(note)
    if params.grammar is not None:  # --grammar or --json-schema's, checked before it runs
        engine.check_grammar(params.grammar)
    prompt: str | list[int] = text
    if fill is not None:
        prompt = model_fim_prompt(engine, fill, params.max_tokens, param="--fim-prefix").tokens
    elif args.chat:
        kind = choice.kind.with_template_hint(engine.info.chat_template is not None)
        if kind.advice():
            _note(f"{choice.label} is {kind.advice()}.")
        prompt, params = _chat_prompt(engine, choice, text, args.system, params)
    if args.json:
        result = engine.generate(prompt, params)
        pair = None if args.target else choice.label
        out = {**json_output(result, engine, params, pair), "saved_stats_used": saved is not None,
               "saved_stats": saved.to_dict() if saved else None}
        print(json.dumps(out, ensure_ascii=False))
        return 0
    return _stream(engine, prompt, params, saved)


def _stream(engine: Engine, prompt: str | list[int], params: GenerationParams,
            saved: SavedStats | None = None) -> int:
    """Print the text as it comes; Ctrl+C stops the engine, ends the line, prints the stats.

    Ctrl+C only asks the engine to stop (a signal handler, not KeyboardInterrupt): an exception
    raised inside the chunk queue's wait could leave its lock held, and the engine thread,
    putting the next chunk, would then wait forever."""
    handle = engine.submit(prompt, params)
    interrupted = threading.Event()

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        interrupted.set()
        handle.cancel()  # the engine stops within one step and ends the stream

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        for chunk in handle:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    finally:
        signal.signal(signal.SIGINT, previous)
        handle.cancel()
    stats = handle.result().stats
    sys.stdout.write("\n")
    sys.stdout.flush()
    verify = engine.learned().verify  # a plain pass's cost as timed (0: never timed)
    slow = slow_run_note(stats.tokens_per_second, stats.n_tokens,
                         verify[1] if len(verify) > 1 else 0.0, engine.options.n_threads or 1)
    if slow is not None:
        _note(slow)
    line = summary_line(stats, engine.info.drafter, saved if params.speculative else None)
    print(line + (" (interrupted)" if interrupted.is_set() else ""), file=sys.stderr)
    return INTERRUPTED if interrupted.is_set() else 0


def json_output(result: GenerationResult, engine: Engine, params: GenerationParams,
                pair: str | None) -> dict[str, Any]:
    """`run --json`: the result plus what produced it (models, seed, sampling parameters)."""
    sampling = {key: value for key, value in asdict(params).items()
                if key not in ("reuse_cache", "prediction")}
    sampling["stop"] = list(params.stop)
    out = {
        **result.to_dict(),
        "target": engine.info.target_path,
        "drafter": engine.info.drafter,
        "exact": engine.info.exact,
        "threads": engine.options.n_threads,
        "pair": pair,
        "params": sampling,
    }
    if params.prediction is not None:  # OpenAI's usage names (completion_tokens_details)
        out["prediction"] = {
            "accepted_prediction_tokens": result.stats.accepted_prediction_tokens,
            "rejected_prediction_tokens": result.stats.rejected_prediction_tokens,
        }
    return out


def _read_stdin() -> str:
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidParameterError(
            f"Standard input is not valid UTF-8 text (byte {data[error.start]:#04x} at offset "
            f"{error.start}); convert it to UTF-8 first, e.g. with iconv."
        ) from None


def summary_line(stats: GenerationStats, drafter: str, saved: SavedStats | None = None) -> str:
    """The run's last line; it names the saved statistics the controller started from, if any."""
    reused = f" | {saved.note()}" if saved else ""
    return (
        f"[{stats.n_tokens} tokens, {stats.tokens_per_second:.1f} tok/s | drafter {drafter}: "
        f"drafted {stats.drafted}, accepted {stats.accepted} "
        f"({stats.acceptance_rate:.0%}), mean accepted length {stats.mean_accepted_length:.2f}, "
        f"{stats.target_passes} target passes{reused}]"
    )
