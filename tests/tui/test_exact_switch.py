"""``/exact`` in the chat (issue 18): exact mode is chosen when llama.cpp picks its kernels, so
the chat restarts in the other mode and the conversation goes on (localspec_tui.restart).
Driven through Textual's pilot against a real engine; the restart's command line through the
real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from localspec.engine import Engine

from .chatui import AssistantMessage, ChatApp, ChatSettings, Notice, UserMessage, module
from .conftest import chat_screen, make_app, send, wait_for_replies

restart = module("restart")
ModeSwitch = restart.ModeSwitch


@pytest.mark.asyncio
async def test_exact_on_exits_with_the_conversation(chat_engine: Engine) -> None:
    app = make_app(chat_engine)
    async with app.run_test(size=(80, 24)) as pilot:
        await send(pilot, "/exact off")  # already off: nothing happens
        await pilot.pause()
        assert app.is_running
        await send(pilot, "hello there")
        await wait_for_replies(pilot, 1)
        messages = list(chat_screen(app).conversation.messages)
        await send(pilot, "/exact")  # flips it
        await pilot.pause()
    assert app.return_value == ModeSwitch(True, messages, None)
    assert [m["role"] for m in messages] == ["user", "assistant"]


@pytest.mark.asyncio
async def test_a_restored_chat_shows_and_continues_the_conversation(chat_engine: Engine) -> None:
    turns = [{"role": "user", "content": "hello there"},
             {"role": "assistant", "content": "general kenobi"}]
    app = ChatApp(chat_engine, settings=ChatSettings(temperature=0.0, max_tokens=8),
                  restored=ModeSwitch(False, turns, "Be brief."))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = chat_screen(app)
        await pilot.pause()
        assert [m.text for m in screen.query(UserMessage)] == ["hello there"]
        assert [m.text for m in screen.query(AssistantMessage)] == ["general kenobi"]
        assert any("Exact mode off" in n.text for n in screen.query(Notice))
        await send(pilot, "and then?")
        await wait_for_replies(pilot, 1)
        assert screen.conversation.messages[:3] == [*turns, {"role": "user",
                                                             "content": "and then?"}]
        assert screen.conversation.system_prompt == "Be brief."


def test_the_restart_command_line(tmp_path: Path) -> None:
    saved = tmp_path / "c.json"
    argv = ["chat", "pair", "--exact", "--restore", "old.json", "--temperature", "0"]
    assert restart.restart_argv(argv, False, saved) == [
        "chat", "pair", "--temperature", "0", "--restore", str(saved)]
    assert restart.restart_argv(["chat"], True, saved) == [
        "chat", "--exact", "--restore", str(saved)]
    switch = ModeSwitch(True, [{"role": "user", "content": "hi"}], None)
    path = restart.save(switch)
    assert restart.restore(str(path)) == switch and not path.exists()


def test_the_restarted_command_reads_the_saved_conversation(tmp_path: Path) -> None:
    """What restart() runs in the process's place is the real CLI: it takes --restore and
    reads the file (a broken one is exit 2 with one sentence)."""
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"messages": "no"}))
    args = restart.restart_argv(["chat", "--threads", "1"], False, broken)
    out = subprocess.run([sys.executable, "-m", "localspec.cli", *args], capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 2, out.stderr
    assert "not a conversation the chat saved" in out.stderr and "Traceback" not in out.stderr
