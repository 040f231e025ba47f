"""The Textual application: loads the models (or takes a loaded engine) and opens the chat."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from textual.app import App

from localspec.errors import LocalspecError
from localspec.models.kind import ModelKind
from localspec.runtime.engine import Engine
from localspec.types import EngineInfo

from .metrics import EngineClock, StepClock
from .mode_switch import ModeSwitch
from .model_info import drafter_label, memory_summary, welcome_lines
from .screens.chat import ChatScreen
from .screens.error import ErrorScreen
from .screens.loading import LoadingScreen
from .settings import ChatSettings
from .widgets.status import ModelLine

EngineLoader = Callable[[], Engine]
ModeLoader = Callable[[bool], Engine]  # loads the models again, exact mode on or off


def load_failure(error: BaseException) -> str:
    """What the error screen says about a failed load: a user mistake's own sentence, else the
    error's type and message (a bug, still without a traceback on screen)."""
    return str(error) if isinstance(error, LocalspecError) else f"{type(error).__name__}: {error}"


class ChatApp(App[None]):
    """``ChatApp(engine=...)`` for a loaded engine, or ``ChatApp(loader=...)`` to load here.

    With a loader, loading runs on a worker thread behind a loading screen; a failure shows
    the error screen with the error's sentence (no traceback), and the app owns (and closes)
    the engine it loaded. ``clock`` times the steps for tokens/s (default: the engine's own).
    ``reload``: loads the models in exact mode or not, for ``/exact`` (mode_switch.py); without
    it ``/exact`` says the chat cannot switch.
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
        reload: ModeLoader | None = None,
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
        self.reload = reload
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

    def _chat_screen(self, engine: Engine, carried: ModeSwitch | None = None) -> ChatScreen:
        info = engine.info
        model = ModelLine(
            target=f"{self.pair}: {info.target_name}" if self.pair else info.target_name,
            drafter=drafter_label(info),
            memory=self.memory or memory_summary(info),
            n_ctx=info.n_ctx,
        )
        notes = self.notes(info) if self.notes is not None else []
        welcome = welcome_lines(info, model, self.kind, self.pair)
        return ChatScreen(
            engine, self.settings, self.clock, model, self.chat_template, self.chat_stop,
            [*welcome, *notes], carried,
        )

    def _load(self) -> None:  # worker thread
        assert self.loader is not None
        try:
            engine = self.loader()
        except Exception as error:  # noqa: BLE001 - shown on the error screen
            self.call_from_thread(self._show_load_error, load_failure(error))
        else:
            self.call_from_thread(self._loaded, engine)

    def _loaded(self, engine: Engine, carried: ModeSwitch | None = None) -> None:
        self.engine, self.owns_engine = engine, True
        self.switch_screen(self._chat_screen(engine, carried))
        self._show_notice(engine)

    # ---- /exact ------------------------------------------------------------------------------

    def on_chat_screen_mode_switch_asked(self, message: ChatScreen.ModeSwitchAsked) -> None:
        if self.reload is None:
            self.notify("This chat was given a loaded engine and cannot reload it in the other "
                        "mode; start `localspec chat` with or without --exact.", severity="warning")
            return
        mode = "exact mode" if message.switch.exact else "default mode"
        self.switch_screen(LoadingScreen(f"{self.loading_label} in {mode}"))
        self.run_worker(lambda: self._reload(message.switch), thread=True, exit_on_error=False,
                        name="reload")

    def _reload(self, switch: ModeSwitch) -> None:  # worker thread
        """The other mode, or (where it cannot load) the mode the chat was in, with a reason."""
        assert self.reload is not None
        if self.owns_engine and self.engine is not None:
            self.engine.close()  # first: both engines at once may not fit
        self.engine, self.owns_engine = None, False
        try:
            engine = self.reload(switch.exact)
        except LocalspecError as error:
            switch = replace(switch, exact=not switch.exact, refused=str(error))
            try:
                engine = self.reload(switch.exact)
            except Exception as again:  # noqa: BLE001 - shown on the error screen
                self.call_from_thread(self._show_load_error, load_failure(again))
                return
        except Exception as error:  # noqa: BLE001 - shown on the error screen
            self.call_from_thread(self._show_load_error, load_failure(error))
            return
        self.call_from_thread(self._loaded, engine, switch)

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
