"""``/exact`` in the chat (issue 18): exact mode is chosen when the model loads, so the chat
loads the models again in the other mode, in the same process, and the conversation goes on
(localspec_tui.mode_switch). Driven through Textual's pilot against real engines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from localspec.errors import InvalidParameterError
from localspec.runtime.engine import Engine

from .chatui import AssistantMessage, ChatApp, ChatSettings, Notice, UserMessage, printable
from .clock import PassCostClock
from .conftest import chat_screen, make_app, send, wait_for, wait_for_replies


def reloading_app(tiny_model_path: Path, reload: Any) -> Any:
    settings = ChatSettings(temperature=0.0, seed=7, max_tokens=12, draft_max=4,
                            system_prompt="Be brief.")
    return ChatApp(loader=lambda: Engine.load(tiny_model_path, draft="ngram", n_ctx=512),
                   reload=reload, settings=settings, clock=PassCostClock(0.02))


def notices(app: Any) -> list[str]:
    return [str(n.text) for n in chat_screen(app).query(Notice)]


async def reloaded(pilot: Any, before: Any) -> Any:
    """The chat screen the reload opens (another than ``before``), once it has mounted."""
    app = pilot.app
    await wait_for(pilot, lambda: app.chat_screen not in (None, before) and
                   any("the chat goes on" in t for t in notices(app)), "the reloaded chat")
    return chat_screen(app)


@pytest.mark.asyncio
async def test_exact_on_reloads_in_this_process_and_the_chat_goes_on(
        tiny_model_path: Path) -> None:
    asked: list[bool] = []

    def reload(exact: bool) -> Engine:
        asked.append(exact)
        return Engine.load(tiny_model_path, draft="ngram", n_ctx=512, exact=exact)

    app = reloading_app(tiny_model_path, reload)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.chat_screen is not None, "the first load")
        first_engine, first = app.engine, chat_screen(app)
        assert not first_engine.info.exact
        await send(pilot, "/exact off")  # already off: nothing is reloaded
        await pilot.pause()
        assert app.chat_screen is first and asked == []
        await send(pilot, "hello there")
        await wait_for_replies(pilot, 1)
        before = list(first.conversation.messages)
        answer = first.last_answer

        await send(pilot, "/exact")  # flips it
        screen = await reloaded(pilot, first)
        assert asked == [True] and app.engine.info.exact and app.engine is not first_engine
        assert first_engine.closed  # the app loaded it, so the app closed it before reloading
        assert [m.text for m in screen.query(UserMessage)] == ["hello there"]
        assert [m.text for m in screen.query(AssistantMessage)] == [printable(answer)]
        assert screen.conversation.system_prompt == "Be brief."
        assert "Exact mode on; the chat goes on." in notices(app)

        await send(pilot, "and then?")
        await wait_for_replies(pilot, 1)
        assert screen.conversation.messages[:3] == [*before, {"role": "user",
                                                              "content": "and then?"}]
        assert screen.conversation.messages[3]["role"] == "assistant"

        await send(pilot, "/exact off")  # and back
        await reloaded(pilot, screen)
        assert asked == [True, False] and not app.engine.info.exact
    assert app.engine.closed  # the app owns what it loaded


@pytest.mark.asyncio
async def test_a_mode_that_cannot_load_keeps_the_chat_in_the_other(tiny_model_path: Path) -> None:
    """Exact mode refused (as on a GPU build with the target's layers offloaded): the chat
    loads its mode again, says why in the refusal's sentence, and the conversation goes on."""
    sentence = "exact mode is bit-identical on the CPU backend only; add --n-gpu-layers 0."

    def reload(exact: bool) -> Engine:
        if exact:
            raise InvalidParameterError(sentence)
        return Engine.load(tiny_model_path, draft="ngram", n_ctx=512)

    app = reloading_app(tiny_model_path, reload)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.chat_screen is not None, "the first load")
        first = chat_screen(app)
        await send(pilot, "hello there")
        await wait_for_replies(pilot, 1)
        await send(pilot, "/exact on")
        screen = await reloaded(pilot, first)
        assert not app.engine.info.exact
        assert f"Exact mode on could not load: {sentence}" in notices(app)
        assert "Exact mode off; the chat goes on." in notices(app)
        assert [m.text for m in screen.query(UserMessage)] == ["hello there"]
        await send(pilot, "and then?")
        await wait_for_replies(pilot, 1)
        assert [m["role"] for m in screen.conversation.messages] == [
            "user", "assistant", "user", "assistant"]


@pytest.mark.asyncio
async def test_a_chat_given_an_engine_without_a_reload_says_so(chat_engine: Engine) -> None:
    app = make_app(chat_engine)
    async with app.run_test(size=(80, 24)) as pilot:
        first = chat_screen(app)
        await send(pilot, "/exact on")
        await pilot.pause()
        assert app.chat_screen is first and app.engine is chat_engine
        assert not chat_engine.closed
