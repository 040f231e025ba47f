"""Regenerate docs/chat.svg: a real conversation in `localspec chat` on the default pair.

    python docs/chat_screenshot.py [QUESTION ...]

Uses the embedded default (Gemma 3 270M + n-gram drafter) through localspec.models.registry,
greedy decoding, the engine's own timings (real tokens/s), provenance colours on.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from textual.widgets import Input

from localspec.models import registry
from localspec.runtime.engine import Engine

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = (
    "What is the capital of France?",
    "Name three planets of the solar system.",
)


def chat_ui() -> object:
    import localspec_tui as package

    return package


async def main(questions: list[str]) -> None:
    ui = chat_ui()
    known = registry.load_registry()
    pair = known.resolve_pair(None)
    engine = Engine.load(pair.target, pair.drafter, n_ctx=pair.n_ctx)
    settings = ui.ChatSettings(temperature=0.0, seed=1, max_tokens=160, draft_max="auto")
    app = ui.ChatApp(
        engine, settings=settings, pair=pair.name, chat_template=pair.chat_template,
        chat_stop=pair.stop, kind=known.kind_of(known.pair(pair.name).target),
    )
    try:
        async with app.run_test(size=(100, 32)) as pilot:
            screen = app.chat_screen
            for number, question in enumerate(questions, start=1):
                screen.query_one(Input).value = question
                await pilot.press("enter")
                while screen.replies_finished < number:
                    await pilot.pause(0.05)
            await pilot.press("f5")
            screen.query_one(Input).cursor_blink = False
            await pilot.pause(0.3)
            app.save_screenshot("chat.svg", path=str(ROOT / "docs"))
    finally:
        engine.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] or list(QUESTIONS)))
