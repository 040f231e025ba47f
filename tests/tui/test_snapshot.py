"""SVG snapshots of the chat at 80x24 and 110x32 after a real (greedy, deterministic) reply,
and of the help at 80x24.

tokens/s comes from the tests' PassCostClock (a fixed cost per target pass), so the numbers
follow the real speculation of this reply but not the machine's load.
Update after an intended change: ``pytest tests/tui/test_snapshot.py --snapshot-update``.
"""

from __future__ import annotations

from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from localspec.runtime.engine import Engine

from .conftest import make_app, send, wait_for_replies


@pytest.mark.parametrize("size", [(80, 24), (110, 32)])
def test_chat_snapshot(chat_engine: Engine, snap_compare: Any, size: tuple[int, int]) -> None:
    app = make_app(chat_engine, max_tokens=40)

    async def converse(pilot: Pilot) -> None:
        pilot.app.screen.query_one(Input).cursor_blink = False
        await send(pilot, "abc abc abc, what comes next?")
        await wait_for_replies(pilot)
        await pilot.press("f5")  # provenance colours on

    assert snap_compare(app, terminal_size=size, run_before=converse)


def test_help_snapshot_80x24(chat_engine: Engine, snap_compare: Any) -> None:
    app = make_app(chat_engine)

    async def open_help(pilot: Pilot) -> None:
        pilot.app.screen.query_one(Input).cursor_blink = False
        await pilot.press("f1")
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=(80, 24), run_before=open_help)
