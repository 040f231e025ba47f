"""The chat app driven through Textual's pilot against a real engine on the tiny model."""

from __future__ import annotations

from argparse import Namespace
from dataclasses import replace
from pathlib import Path

import pytest
from textual.widgets import Input

from localspec.commands.limits import limit_notes
from localspec.models.kind import ModelKind
from localspec.runtime.engine import Engine

from .chatui import (
    AssistantMessage,
    ChatApp,
    ChatSettings,
    Conversation,
    ErrorScreen,
    HelpScreen,
    Notice,
    StatusBar,
    UserMessage,
    printable,
)
from .conftest import (
    chat_screen,
    long_reply_settings,
    make_app,
    send,
    start,
    wait_for,
    wait_for_replies,
)

pytestmark = pytest.mark.asyncio


def status_text(app: ChatApp) -> str:
    """The status bar's text; "" while a screen that was just switched to is still composing."""
    bars = app.screen.query(StatusBar)
    return str(bars.first().render()) if bars else ""


def greedy_reply(engine: Engine, question: str, max_tokens: int, ignore_eos: bool = False) -> str:
    """What the target alone says, greedily, to the same one-turn chat (the lossless check)."""
    conversation = Conversation()
    conversation.add("user", question)
    prompt = conversation.prepare(engine.info, engine.tokenize, max_tokens)
    result = engine.generate(
        prompt.tokens,
        temperature=0.0,
        max_tokens=max_tokens,
        speculative=False,
        ignore_eos=ignore_eos,
        stop=Conversation.stop_strings(conversation, engine.info),
    )
    return result.text


async def test_reply_streams_into_transcript_and_stats_change(chat_engine: Engine) -> None:
    app = make_app(chat_engine)
    async with app.run_test(size=(80, 24)) as pilot:
        before = status_text(app)
        assert "-  tok/s" in before and "spec ON" in before
        await send(pilot, "Hello there", type_it=True)
        await wait_for_replies(pilot)
        screen = chat_screen(app)
        users = list(screen.query(UserMessage))
        replies = list(screen.query(AssistantMessage))
        assert [u.text for u in users] == ["Hello there"]
        assert len(replies) == 1 and replies[0].text
        # the transcript holds exactly the target's own greedy answer (speculation is lossless)
        expected = greedy_reply(chat_engine, "Hello there", 24)
        assert screen.conversation.messages[-1] == {"role": "assistant", "content": expected}
        after = status_text(app)
        assert after != before
        assert "tok/s" in after and "-  tok/s" not in after
        stats = screen.metrics.stats
        assert stats.n_tokens == 24 and stats.drafted > 0
        assert f"τ {stats.mean_accepted_length:4.2f}" in after
        assert "24 tokens" in str(replies[0].query_one(".meta").render())


async def test_second_turn_uses_history(chat_engine: Engine) -> None:
    app = make_app(chat_engine, max_tokens=8)
    async with app.run_test(size=(80, 24)) as pilot:
        await send(pilot, "first question")
        await wait_for_replies(pilot, 1)
        await send(pilot, "second question")
        await wait_for_replies(pilot, 2)
        screen = chat_screen(app)
        roles = [m["role"] for m in screen.conversation.messages]
        assert roles == ["user", "assistant", "user", "assistant"]
        assert screen.context_used > 2 * 8


async def test_toggle_speculation_changes_status_and_generation(chat_engine: Engine) -> None:
    app = make_app(chat_engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f2")
        assert "spec OFF" in status_text(app)
        assert app.settings.speculative is False
        await send(pilot, "Hello there")
        await wait_for_replies(pilot)
        stats = chat_screen(app).metrics.stats
        assert stats.drafted == 0 and stats.mean_accepted_length == pytest.approx(1.0)
        await pilot.press("f2")
        assert "spec ON" in status_text(app)
        await pilot.press("f3")  # draft length 4 -> 5
        assert "k 5" in status_text(app)
        await pilot.press("f4")  # temperature 0 -> 0.2
        assert "T 0.2" in status_text(app)


async def test_speculation_toggled_mid_reply_keeps_the_answer(chat_engine: Engine) -> None:
    app = make_app(chat_engine, **{**long_reply_settings(), "max_tokens": 600})
    async with app.run_test(size=(80, 24)) as pilot:
        screen = chat_screen(app)
        await start(pilot, "Hello there")
        await pilot.press("f2")  # off while streaming: the reply continues without drafting
        await wait_for_replies(pilot)
        assert app.settings.speculative is False
        assert screen.metrics.segments == 2 and screen.metrics.tokens == 600
        assert screen.metrics.stats.drafted == 0  # the second part ran without drafting
        answer = screen.conversation.messages[-1]["content"]
        assert answer == greedy_reply(chat_engine, "Hello there", 600, ignore_eos=True)
        assert screen.reply.text == printable(answer)  # the transcript shows the joined text


async def test_escape_cancels_the_reply(chat_engine: Engine) -> None:
    app = make_app(chat_engine, **long_reply_settings())
    async with app.run_test(size=(80, 24)) as pilot:
        screen = chat_screen(app)
        await start(pilot, "Tell me a long story")
        await pilot.press("escape")
        await wait_for_replies(pilot)
        assert not screen.generating
        assert screen.metrics.tokens < 1500
        meta = str(screen.reply.query_one(".meta").render())
        assert "stopped" in meta
        # one tok/s: the reply's closing line says what the status bar shows
        rate = meta.split(" tok/s")[0].rsplit("· ", 1)[-1]
        assert status_text(app).splitlines()[0].split(" tok/s")[0].endswith(" " + rate)
        # the chat goes on after a cancelled reply
        app.settings.max_tokens = 4
        app.settings.base = type(app.settings.base)()
        await send(pilot, "again")
        await wait_for_replies(pilot, 2)
        assert screen.conversation.messages[-1]["role"] == "assistant"


async def test_provenance_colours_cover_the_reply(chat_engine: Engine) -> None:
    app = make_app(chat_engine, max_tokens=60)
    async with app.run_test(size=(80, 24)) as pilot:
        await send(pilot, "abc abc abc abc")
        await wait_for_replies(pilot)
        await pilot.press("f5")
        await pilot.pause()
        reply = chat_screen(app).query_one(AssistantMessage)
        assert reply.has_class("-provenance")
        assert "■ draft" in status_text(app)
        kinds = {kind for _, _, kind in reply.spans}
        assert kinds == {"draft", "target"}
        assert reply.spans[0][0] == 0 and reply.spans[-1][1] >= len(reply.text) - 4
        styled = reply.provenance_text()
        assert styled.plain == reply.text and len(styled.spans) == len(reply.spans)
        await pilot.press("f5")
        await pilot.pause()
        assert not reply.has_class("-provenance")


async def test_new_chat_copy_and_help(chat_engine: Engine) -> None:
    app = make_app(chat_engine, max_tokens=6)
    async with app.run_test(size=(80, 24)) as pilot:
        await send(pilot, "Hello")
        await wait_for_replies(pilot)
        screen = chat_screen(app)
        await pilot.press("ctrl+y")
        assert app.clipboard == screen.last_answer != ""
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert app.screen is screen
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert screen.conversation.messages == []
        assert not list(screen.query(AssistantMessage))


async def test_slash_commands(chat_engine: Engine) -> None:
    app = make_app(chat_engine)
    async with app.run_test(size=(80, 24)) as pilot:
        for command in ("/temp 0.5", "/k 3", "/spec off", "/system Be brief.", "/bogus"):
            await send(pilot, command)
        await pilot.pause()
        text = status_text(app)
        assert "T 0.5" in text and "k 3" in text and "spec OFF" in text
        screen = chat_screen(app)
        assert screen.conversation.system_prompt == "Be brief."
        notices = [n.text for n in screen.query(Notice)]
        assert any("unknown command /bogus" in n.lower() for n in notices)
        assert app.screen.query_one(Input).value == ""


async def test_history_is_trimmed_when_it_outgrows_the_context(tiny_model_path: Path) -> None:
    engine = Engine.load(tiny_model_path, draft="ngram", n_ctx=128)
    try:
        app = make_app(engine, max_tokens=16)
        async with app.run_test(size=(80, 24)) as pilot:
            for i in range(4):
                await send(pilot, f"message number {i} " + "words " * 6)
                await wait_for_replies(pilot, i + 1)
            screen = chat_screen(app)
            notices = [n.text for n in screen.query(Notice)]
            assert any("dropped the" in n and "oldest" in n for n in notices)
            assert screen.conversation.messages[0]["role"] == "user"
            assert screen.conversation.messages[-1]["role"] == "assistant"
    finally:
        engine.close()


async def test_load_failure_shows_the_error_screen(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF but not really a model file")
    app = ChatApp(loader=lambda: Engine.load(broken, draft="ngram"))
    async with app.run_test(size=(80, 24)) as pilot:
        # The screen is pushed before its widgets are mounted: wait for the message itself.
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, ErrorScreen)
            and bool(app.screen.query("#error-message")),
            "the error screen's message",
        )
        screen = app.screen
        message = str(screen.query_one("#error-message").render())
        assert message == app.load_error
        assert "Traceback" not in message and len(message) > 10
        await pilot.press("q")
    assert app.return_code == 0


async def test_missing_model_message(tmp_path: Path) -> None:
    app = ChatApp(loader=lambda: Engine.load(tmp_path / "nope.gguf"))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ErrorScreen), "the error screen")
        assert "does not exist" in (app.load_error or "")


async def test_loader_success_opens_the_chat(tiny_model_path: Path) -> None:
    app = ChatApp(loader=lambda: Engine.load(tiny_model_path, draft="none", n_ctx=256))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.chat_screen is app.screen, "the chat screen")
        await wait_for(pilot, lambda: "tiny-target │ drafter none" in status_text(app),
                       "the status bar")
    assert app.engine is not None and app.owns_engine


# ---- welcome line, limits, status bar at 80 columns, colours, help -----------------------


def screen_lines(app: ChatApp) -> list[str]:
    return [strip.text.rstrip() for strip in app.screen._compositor.render_strips()]


async def test_welcome_line_names_model_kind_drafter_and_keys(chat_engine: Engine) -> None:
    base = ModelKind("base", "gemma3-1b-it")
    app = ChatApp(chat_engine, settings=ChatSettings(), kind=base, pair="tiny-pair",
                  notes=lambda info: limit_notes(Namespace(n_gpu_layers=None), 100, info))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        notices = [n.text for n in chat_screen(app).query(Notice)]
        assert notices[0] == ("tiny-target (base model) drafted by ngram. Enter sends · F1 help "
                              "· F2 speculation · F5 colours · Esc stops · Ctrl+Q quits.")
        assert notices[1].startswith("tiny-pair is a base model: it continues text")
        assert "`localspec pull gemma3-1b-it`" in notices[1]
        assert notices[2] == ("the context was raised from 100 to 2048 tokens: llama.cpp sizes "
                              "it in steps of 256 tokens.")
    guessed = make_app(chat_engine)  # no models.toml entry: the GGUF has a chat template
    async with guessed.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        notices = [n.text for n in chat_screen(guessed).query(Notice)]
        assert notices[0].startswith(
            "tiny-target (instruct model, by its chat template) drafted by ngram.")
        assert len(notices) == 1


async def test_status_bar_keeps_numbers_ctx_and_legend_at_80_columns(chat_engine: Engine) -> None:
    app = make_app(chat_engine, max_tokens=8)
    async with app.run_test(size=(80, 24)) as pilot:
        await send(pilot, "Hello")
        await wait_for_replies(pilot)
        await pilot.press("f5")
        await pilot.pause()
        first, second = status_text(app).splitlines()
        assert "tok/s" in first and "accept" in first and "τ" in first and "spec ON" in first
        assert "ctx " in second and second.endswith("colours: ■ draft ■ target")
        assert "mem " not in second  # the memory plan gave way at 80 columns
        bar = chat_screen(app).query_one(StatusBar)
        wide = str(bar.build(None, app.settings, False, True, 10, width=140)).splitlines()[1]
        assert "mem " in wide and "tiny-target │ drafter ngram" in wide
        long = replace(bar.model, target="qwen2.5-coder-1.5b: Qwen2.5 Coder 1.5B Instruct",
                       drafter="ngram+qwen2.5-coder-0.5b-instruct-q4_k_m",
                       memory="mem CPU 1.9 GiB + host 150.0 MiB")
        at_120 = StatusBar(long).build(None, app.settings, False, True, 10, width=120)
        assert "drafter ngram+qwen2.5-coder-0.5b-instruct-q4_k_m" in str(at_120)
        narrow = bar.build(None, app.settings, False, True, 10, width=30)
        assert all(len(line) <= 30 for line in str(narrow).splitlines())
        assert str(narrow).splitlines()[1].startswith("colours: ■ draft")


async def test_footer_shows_quit_and_ctrl_q_quits(chat_engine: Engine) -> None:
    app = make_app(chat_engine)
    async with app.run_test(size=(120, 30)) as pilot:
        await pilot.pause()
        footer = [str(key.description) for key in app.screen.query("FooterKey")]
        assert "Quit" in footer
        await pilot.press("ctrl+q")
        await pilot.pause()
    assert app.return_code == 0


async def test_colours_on_do_not_move_old_replies(chat_engine: Engine) -> None:
    app = make_app(chat_engine, max_tokens=40)
    async with app.run_test(size=(80, 24)) as pilot:
        await send(pilot, "abc abc abc abc")
        await wait_for_replies(pilot)
        reply = chat_screen(app).query_one(AssistantMessage)
        await reply.replace_text("A list:\n\n- one\n- two\n\n1. first\n\n```\ncode\n```\n\n# Title")
        await pilot.pause()
        before = screen_lines(app)
        await pilot.press("f5")
        await pilot.pause()
        after = screen_lines(app)
        assert reply.has_class("-provenance")
        body = [i for i, line in enumerate(before) if "- one" in line or "```" in line]
        assert len(body) == 3  # shown as written, not re-rendered as Markdown
        bottom = chat_screen(app).query_one("#transcript").region.bottom
        assert before[:bottom] == after[:bottom]  # the transcript, line for line


@pytest.mark.parametrize("size, hint", [((80, 24), "scroll"), ((120, 70), "Esc closes")])
async def test_help_says_when_it_scrolls(chat_engine: Engine, size: tuple[int, int],
                                         hint: str) -> None:
    app = make_app(chat_engine)
    async with app.run_test(size=size) as pilot:
        await pilot.press("f1")
        await pilot.pause(0.2)
        box = app.screen.query_one("#help-box")
        assert isinstance(app.screen, HelpScreen)
        assert hint in str(box.border_subtitle)
        assert ("scroll" in str(box.border_subtitle)) == (box.max_scroll_y > 0)
