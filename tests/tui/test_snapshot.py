"""An SVG snapshot of the chat at 80x24 after a real (greedy, deterministic) reply.

tokens/s comes from PassCostClock (a fixed cost per target pass, marked ``tok/s*`` on screen),
so the numbers follow the real speculation of this reply but not the machine's load.
Update after an intended change: ``pytest tests/tui/test_snapshot.py --snapshot-update``.
"""

from __future__ import annotations

from typing import Any

from textual.pilot import Pilot
from textual.widgets import Input

from localspec.engine import Engine

from .conftest import make_app, send, wait_for_replies


def test_chat_snapshot_80x24(chat_engine: Engine, snap_compare: Any) -> None:
    app = make_app(chat_engine, max_tokens=40)

    async def converse(pilot: Pilot) -> None:
        pilot.app.screen.query_one(Input).cursor_blink = False
        await send(pilot, "abc abc abc, what comes next?")
        await wait_for_replies(pilot)
        await pilot.press("f5")  # provenance colours on

    assert snap_compare(app, terminal_size=(80, 24), run_before=converse)
