"""The Textual application: loads the models (or takes a loaded engine) and opens the chat."""

from __future__ import annotations

from collections.abc import Callable

from textual.app import App

from localspec.engine import Engine
from localspec.errors import LocalspecError
from localspec.model_kind import ModelKind
from localspec.types import EngineInfo

from .metrics import EngineClock, StepClock
from .model_info import memory_summary, pair_label, welcome_lines
from .restart import ModeSwitch
from .screens.chat import ChatScreen
from .screens.error import ErrorScreen
from .screens.loading import LoadingScreen
from .settings import ChatSettings
from .widgets.status import ModelLine

EngineLoader = Callable[[], Engine]


class ChatApp(App[ModeSwitch | None]):
    """``ChatApp(engine=...)`` for a loaded engine, or ``ChatApp(loader=...)`` to load here.

    With a loader, loading runs on a worker thread behind a loading screen; a failure shows
    the error screen with the error's sentence (no traceback), and the app owns (and closes)
    the engine it loaded. ``clock`` times the steps for tokens/s (default: the engine's own).
    ``restored``: the conversation of the chat that restarted into this one (``/exact``); the
    app's result is a ModeSwitch when the user asks for the other mode.
    """

    CSS_PATH = "chat.tcss"
    TITLE = "localspec chat"
    ENABLE_COMMAND_PALETTE = False  # the footer has no room for it at 80 columns

    def __init__(
        self,
        engine: Engine | None = None,
        *,
        loader: EngineLoader | None = None,
        settings: ChatSettings | None = None,
        clock: StepClock | None = None,
        pair: str | None = None,
        memory: str | None = None,
        chat_template: str | None = None,
        chat_stop: tuple[str, ...] = (),
        loading_label: str = "the models",
        kind: ModelKind | None = None,
        notes: Callable[[EngineInfo], list[str]] | None = None,
        restored: ModeSwitch | None = None,
    ) -> None:
        super().__init__()
        if (engine is None) == (loader is None):
            raise ValueError("pass exactly one of engine= and loader=")
        self.engine = engine
        self.loader = loader
        self.settings = settings or ChatSettings()
        self.clock: StepClock = clock or EngineClock()
        self.pair = pair
        self.memory = memory
        self.chat_template = chat_template  # overrides the GGUF's template when given
        self.chat_stop = chat_stop  # strings that end a reply under that template
        self.loading_label = loading_label
        self.kind = kind or ModelKind()  # base or instruct, from models.toml when it says
        self.notes = notes  # sentences about limits (a context llama.cpp enlarged, ...)
        self.restored = restored
        self.owns_engine = False
        self.load_error: str | None = None

    def on_mount(self) -> None:
        if self.engine is not None:
            self.push_screen(self._chat_screen(self.engine))
            self._show_notice(self.engine)
            return
        self.push_screen(LoadingScreen(self.loading_label))
        self.run_worker(self._load, thread=True, exit_on_error=False, name="load")

    @property
    def chat_screen(self) -> ChatScreen | None:
        for screen in self.screen_stack:
            if isinstance(screen, ChatScreen):
                return screen
        return None

    def _chat_screen(self, engine: Engine) -> ChatScreen:
        info = engine.info
        model = ModelLine(
            pair=f"{self.pair}: {pair_label(info)}" if self.pair else pair_label(info),
            drafter=info.drafter,
            memory=self.memory or memory_summary(info),
            n_ctx=info.n_ctx,
        )
        notes = self.notes(info) if self.notes is not None else []
        welcome = welcome_lines(info, model, self.kind, self.pair)
        return ChatScreen(
            engine, self.settings, self.clock, model, self.chat_template, self.chat_stop,
            [*welcome, *notes], self.restored,
        )

    def _load(self) -> None:  # worker thread
        assert self.loader is not None
        try:
            engine = self.loader()
        except LocalspecError as error:
            self.call_from_thread(self._show_load_error, str(error))
        except Exception as error:  # not a user mistake, but still no traceback on screen
            self.call_from_thread(self._show_load_error, f"{type(error).__name__}: {error}")
        else:
            self.call_from_thread(self._loaded, engine)

    def _loaded(self, engine: Engine) -> None:
        self.engine, self.owns_engine = engine, True
        self.switch_screen(self._chat_screen(engine))
        self._show_notice(engine)

    def _show_notice(self, engine: Engine) -> None:
        """What the user should know about the loaded models (e.g. why speculation is off)."""
        if engine.info.notice:
            self.notify(engine.info.notice, title="localspec", severity="warning", timeout=15)

    def _show_load_error(self, message: str) -> None:
        self.load_error = message
        self.switch_screen(ErrorScreen("localspec chat could not load the model", message))

    def on_unmount(self) -> None:
        screen = self.chat_screen
        if screen is not None and screen.job is not None:
            screen.job.cancel()
        if self.owns_engine and self.engine is not None:
            self.engine.close()
