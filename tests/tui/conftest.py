"""Fixtures of the chat UI tests: one real engine over the tiny generated model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from localspec.runtime.engine import Engine
from localspec.types import GenerationParams

from .chatui import ChatApp, ChatScreen, ChatSettings
from .clock import PassCostClock

REPLY_TIMEOUT = 60.0  # generous: the suite may share a busy machine


@pytest.fixture(scope="module")
def chat_engine(tiny_model_path: Path) -> Iterator[Engine]:
    """The tiny target with the n-gram drafter (speculation visibly accepts tokens)."""
    engine = Engine.load(tiny_model_path, draft="ngram", n_ctx=2048)
    yield engine
    engine.close()


def make_app(engine: Engine, **settings: Any) -> Any:
    """A chat app on ``engine``: greedy, fixed seed, fixed draft length (the "auto" controller
    reacts to measured timings), fixed cost per target pass: deterministic."""
    options: dict[str, Any] = {"temperature": 0.0, "seed": 7, "max_tokens": 24, "draft_max": 4}
    options.update(settings)
    return ChatApp(engine, settings=ChatSettings(**options), clock=PassCostClock(0.02))


def long_reply_settings() -> dict[str, Any]:
    """A reply that runs until it is stopped (or 1500 tokens): for Esc and live toggles."""
    return {"max_tokens": 1500, "base": GenerationParams(ignore_eos=True)}


def chat_screen(app: Any) -> Any:
    screen = app.chat_screen
    assert isinstance(screen, ChatScreen)
    return screen


async def send(pilot: Pilot, text: str, *, type_it: bool = False) -> None:
    """Submit ``text`` from the input box: typed key by key, or pasted (faster)."""
    await pilot.pause()
    if type_it:
        await pilot.press(*text)
    else:
        pilot.app.screen.query_one(Input).value = text
    await pilot.press("enter")


async def start(pilot: Pilot, text: str) -> None:
    """Submit ``text`` and return as soon as the reply is streaming.

    ``pilot.press("enter")`` would wait for the app to go idle, which it does only once the
    reply has finished; this submits the same way Enter does but does not wait for that.
    """
    screen = chat_screen(pilot.app)
    prompt = screen.query_one(Input)
    prompt.value = text
    await prompt.action_submit()
    deadline = time.monotonic() + REPLY_TIMEOUT
    while screen.reply is None or not screen.reply.text:
        if time.monotonic() > deadline:
            raise AssertionError("the reply did not start")
        await asyncio.sleep(0.005)
    assert screen.generating, "the reply finished before the test could interrupt it"


async def wait_for(pilot: Pilot, condition: Any, what: str) -> None:
    deadline = time.monotonic() + REPLY_TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)


async def wait_for_replies(pilot: Pilot, count: int = 1) -> None:
    screen = chat_screen(pilot.app)
    await wait_for(pilot, lambda: screen.replies_finished >= count, f"{count} finished replies")
    await pilot.pause()
