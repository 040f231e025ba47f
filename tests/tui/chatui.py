"""The chat UI under test: the ``localspec_tui`` package (in ``tui/localspec_tui`` in the
checkout, installed under that name)."""

from __future__ import annotations

import importlib
from types import ModuleType

PACKAGE = "localspec_tui"


def module(name: str) -> ModuleType:
    return importlib.import_module(f"{PACKAGE}.{name}")


ChatApp = module("app").ChatApp
ChatSettings = module("settings").ChatSettings
ReplyMetrics = module("metrics").ReplyMetrics
EngineClock = module("metrics").EngineClock
Conversation = module("conversation").Conversation
ProvenanceTracker = module("provenance").ProvenanceTracker
ChatScreen = module("screens.chat").ChatScreen
ErrorScreen = module("screens.error").ErrorScreen
HelpScreen = module("screens.help").HelpScreen
AssistantMessage = module("widgets.transcript").AssistantMessage
UserMessage = module("widgets.transcript").UserMessage
printable = module("widgets.transcript").printable
Notice = module("widgets.transcript").Notice
StatusBar = module("widgets.status").StatusBar
numbers_line = module("widgets.status").numbers_line
spark_text = module("widgets.charts").spark_text
cli = module("cli")
commands = module("commands")
settings_module = module("settings")
