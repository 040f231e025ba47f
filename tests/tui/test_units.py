"""The chat UI's logic without the UI: settings, commands, metrics, provenance, prompts, CLI."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest

from localspec.errors import InvalidParameterError, PromptTooLongError
from localspec.runtime.engine import Engine
from localspec.types import GenerationStats

from .chatui import (
    ChatSettings,
    Conversation,
    EngineClock,
    ProvenanceTracker,
    ReplyMetrics,
    cli,
    commands,
    module,
    numbers_line,
    settings_module,
    spark_text,
)
from .clock import PassCostClock


def test_settings_cycle_and_params() -> None:
    settings = ChatSettings(temperature=0.0, draft_max="auto")
    assert settings.next_draft_max() == 1
    settings.draft_max = 8
    assert settings.next_draft_max() == "auto"
    assert settings.next_temperature() == 0.2
    params = replace(settings, speculative=False).params()
    assert params.speculative is False and params.draft_max == 8
    with pytest.raises(InvalidParameterError):
        ChatSettings(temperature=-1).params()
    assert settings_module.parse_draft_max(" AUTO ") == "auto"
    with pytest.raises(ValueError, match="between 0 and 64"):
        settings_module.parse_draft_max("65")


def test_f3_draft_lengths_are_what_the_help_and_readme_say() -> None:
    text = settings_module.DRAFT_CYCLE_TEXT
    assert text == "auto, 1, 2, 3, 4, 5, 6, 8"
    assert f"draft length: {text} |" in module("screens.help").HELP
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    assert f"F3 draft length ({text};" in " ".join(readme.split())


def test_commands_parse() -> None:
    assert commands.parse_command("/temp 0.7") == commands.Command("temp", "0.7")
    assert commands.parse_command("/colors").name == "colours"
    with pytest.raises(ValueError, match="unknown command /nope"):
        commands.parse_command("/nope")
    assert commands.parse_switch("", True) is False
    assert commands.parse_switch("on", False) is True
    with pytest.raises(ValueError):
        commands.parse_switch("maybe", True)


def test_metrics_with_a_fixed_pass_cost() -> None:
    metrics = ReplyMetrics(clock=PassCostClock(0.02))
    # step 1: 3 drafted, 2 accepted + 1 target token, one pass
    metrics.update(3, GenerationStats(n_tokens=3, drafted=3, accepted=2, target_passes=1))
    # step 2: nothing drafted, one target token, one pass
    metrics.update(1, GenerationStats(n_tokens=4, drafted=3, accepted=2, target_passes=2))
    assert metrics.rolling_tokens_per_second == pytest.approx(4 / 0.04)
    assert metrics.acceptance_history[0] == pytest.approx(2 / 3)
    assert metrics.acceptance_history[1] is None  # nothing drafted: no value, not a rejection
    assert metrics.shown_tokens_per_second(generating=True) == metrics.rolling_tokens_per_second
    assert metrics.shown_tokens_per_second(generating=False) == metrics.average_tokens_per_second
    metrics.reset()
    assert metrics.segments == 2 and metrics.stats.n_tokens == 0


def test_status_bar_shows_the_reply_average_once_it_ended() -> None:
    """One tok/s: after the reply the status bar shows the figure its closing line says (the
    whole reply's average), not the rolling rate of its last steps."""
    metrics = ReplyMetrics(clock=PassCostClock(0.02))
    stats = GenerationStats()
    for n_new in [1] * 20 + [4] * 12:  # slow start, fast end: rolling != average
        stats = replace(stats, n_tokens=stats.n_tokens + n_new,
                        target_passes=stats.target_passes + 1)
        metrics.update(n_new, stats)
    assert metrics.rolling_tokens_per_second != pytest.approx(metrics.average_tokens_per_second)
    settings = ChatSettings()
    ended = "".join(str(text) for _, text in numbers_line(metrics, settings, False))
    streaming = "".join(str(text) for _, text in numbers_line(metrics, settings, True))
    assert f"{metrics.average_tokens_per_second:5.1f} tok/s" in ended
    assert f"{metrics.rolling_tokens_per_second:5.1f} tok/s" in streaming


def test_engine_clock_uses_generation_seconds() -> None:
    clock = EngineClock()
    before = GenerationStats(generation_seconds=0.5)
    assert clock.step_seconds(before, GenerationStats(generation_seconds=0.75)) == 0.25


def test_spark_text() -> None:
    assert spark_text([0.0, 0.5, 1.0], 10, 1.0) == "▁▅█"
    assert len(spark_text([1.0] * 100, 10, 1.0)) == 10
    assert spark_text([], 5, 1.0) == ""
    assert spark_text([1.0, None, 0.0], 10, 1.0) == "█·▁"  # None (k = 0) is not a rejection
    assert spark_text([None, None, 1.0, None], 2, 1.0) == "·█"  # a bucket without values


def test_provenance_spans_match_the_text(chat_engine: Engine) -> None:
    handle = chat_engine.submit("abc abc abc abc abc", temperature=0.0, max_tokens=40)
    tracker = ProvenanceTracker(chat_engine.detokenize)
    spans: list[tuple[int, int, str]] = []
    text = ""
    for chunk in handle:
        text += chunk.text
        spans += tracker.add(chunk.tokens, chunk.provenance)
    assert spans and spans[0][0] == 0
    assert all(a < b for a, b, _ in spans)
    assert all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))
    assert spans[-1][1] == len(chat_engine.detokenize(tracker.tokens))
    drafted = sum(1 for p in handle.result().provenance if p == "draft")
    assert (drafted > 0) == any(kind == "draft" for _, _, kind in spans)


def test_conversation_prompt_and_trimming(chat_engine: Engine) -> None:
    info = chat_engine.info
    conversation = Conversation(system_prompt="Be brief.")
    conversation.add("user", "hello")
    prompt = conversation.prepare(info, chat_engine.tokenize, 32)
    text = chat_engine.detokenize(prompt.tokens)
    assert "Be brief." in text and text.rstrip().endswith("assistant")
    assert prompt.dropped == 0 and prompt.max_tokens == 32
    small = replace(info, n_ctx=96)
    for i in range(6):
        conversation.add("assistant", f"answer {i} " + "word " * 8)
        conversation.add("user", f"question {i} " + "word " * 8)
    prompt = conversation.prepare(small, chat_engine.tokenize, 16)
    assert prompt.dropped > 0 and len(prompt.tokens) <= 96 - 16
    assert conversation.messages[0]["role"] == "user"
    conversation.add("user", "word " * 400)
    with pytest.raises(PromptTooLongError):
        conversation.prepare(small, chat_engine.tokenize, 16)


def test_chatml_stop_strings_only_without_a_template(chat_engine: Engine) -> None:
    conversation = Conversation()
    assert conversation.stop_strings(chat_engine.info) == ()  # the tiny model has a template
    bare = replace(chat_engine.info, chat_template=None)
    assert "<|im_end|>" in conversation.stop_strings(bare)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["chat", *argv])


def test_cli_registers_chat(tiny_model_path: object) -> None:
    args = parse(
        [
            "--target",
            str(tiny_model_path),
            "--draft",
            "none",
            "--system",
            "Hi",
            "--temperature",
            "0",
            "--draft-max",
            "4",
            "--no-spec",
        ]
    )
    choice = cli.resolve_models(args)
    assert choice.target == str(tiny_model_path) and str(choice.drafter) == "none"
    settings = cli.settings_from_args(args, choice)
    assert settings.system_prompt == "Hi" and settings.draft_max == 4
    assert settings.temperature == 0.0 and settings.speculative is False
    assert args.func is cli.run_chat


def test_cli_mode_loader_loads_the_same_models_in_either_mode(tiny_model_path: object) -> None:
    """/exact's reload, from the chat's own command line: the same target, drafter and context
    with exact mode as asked."""
    args = parse(["--target", str(tiny_model_path), "--draft", "ngram", "--ctx", "768"])
    reload = cli.mode_loader(args, cli.resolve_models(args))
    for exact in (True, False):
        engine = reload(exact)
        try:
            assert engine.info.exact is exact and engine.info.n_ctx == 768
            assert engine.info.drafter_spec.kind == "ngram"
        finally:
            engine.close()
    assert args.exact is False  # the chat's own flags are left as they were


def test_cli_rejects_bad_values(tiny_model_path: object,
                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:  # argparse's one line and exit code 2
        parse(["--target", str(tiny_model_path), "--draft-max", "lots"])
    assert exited.value.code == 2 and "--draft-max" in capsys.readouterr().err
    with pytest.raises(InvalidParameterError, match="either a PAIR"):
        cli.resolve_models(parse(["mypair", "--target", str(tiny_model_path)]))
