"""The chat: transcript, sparklines, status bar, input and footer."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Input

from localspec.errors import LocalspecError
from localspec.runtime.engine import Engine

from ..commands import parse_command, parse_max_tokens, parse_switch
from ..conversation import Conversation
from ..generation import ReplyChunk, ReplyFailed, ReplyFinished, ReplyJob, ReplySegment
from ..metrics import ReplyMetrics, StepClock
from ..mode_switch import ModeSwitch
from ..settings import ChatSettings, parse_draft_max, parse_temperature
from ..widgets.charts import SparkRow
from ..widgets.status import ModelLine, StatusBar
from ..widgets.transcript import AssistantMessage, Notice, Transcript, UserMessage, printable
from .help import HelpScreen

FINISH_NOTES = {"stop": "", "length": " · length limit", "cancelled": " · stopped"}


class ChatScreen(Screen[None]):
    class ModeSwitchAsked(Message):
        """``/exact``: the app loads the other mode and carries the conversation over."""

        def __init__(self, switch: ModeSwitch) -> None:
            super().__init__()
            self.switch = switch

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Stop", priority=True),
        Binding("f1", "help", "Help"),
        Binding("f2", "toggle_speculation", "Spec"),
        Binding("f3", "cycle_draft", "Draft k"),
        Binding("f4", "cycle_temperature", "Temp"),
        Binding("f5", "toggle_provenance", "Colours"),
        Binding("ctrl+n", "new_chat", "New", priority=True),
        Binding("ctrl+y", "copy_last", "Copy", priority=True),
        Binding("ctrl+q", "app.quit", "Quit", priority=True),
    ]

    def __init__(
        self,
        engine: Engine,
        settings: ChatSettings,
        clock: StepClock,
        model: ModelLine,
        chat_template: str | None = None,
        chat_stop: tuple[str, ...] = (),
        welcome: list[str] | None = None,
        carried: ModeSwitch | None = None,
    ) -> None:
        super().__init__()
        self.welcome = welcome or []  # the first notices: model, drafter, keys, limits
        self.carried = carried  # the conversation of the chat before /exact reloaded the models
        self.engine = engine
        self.settings = settings
        self.clock = clock
        self.model = model
        self.conversation = Conversation(settings.system_prompt, chat_template, chat_stop)
        self.metrics: ReplyMetrics | None = None
        self.job: ReplyJob | None = None
        self.reply: AssistantMessage | None = None
        self.last_answer = ""
        self.show_provenance = False
        self.context_used = 0
        self.replies_finished = 0
        self._job_counter = 0

    def compose(self) -> ComposeResult:
        yield Transcript(id="transcript")
        yield SparkRow(id="sparks")
        yield StatusBar(self.model, id="status")
        yield Input(placeholder="Message (Enter sends, F1 help, /help)", id="prompt")
        yield Footer(compact=True)

    async def on_mount(self) -> None:
        self.query_one(Input).focus()
        for line in self.welcome:
            await self.notice(line)
        if self.settings.system_prompt:
            await self.notice(f"System prompt: {self.settings.system_prompt}")
        if self.carried is not None:
            await self.show_carried(self.carried)
        self.refresh_status()

    async def show_carried(self, carried: ModeSwitch) -> None:
        """The turns of the chat before /exact reloaded the models; the conversation goes on."""
        transcript = self.query_one(Transcript)
        self.conversation.system_prompt = carried.system_prompt
        for message in carried.messages:
            self.conversation.add(message["role"], message["content"])
            if message["role"] == "user":
                await transcript.add(UserMessage(message["content"]))
                continue
            reply = AssistantMessage(self.show_provenance)
            await transcript.add(reply)
            await reply.replace_text(message["content"])
            await reply.finish("")
            self.last_answer = message["content"]
        if carried.refused:
            await self.notice(f"Exact mode {'off' if carried.exact else 'on'} could not load: "
                              f"{carried.refused}", error=True)
        await self.notice(f"Exact mode {'on' if carried.exact else 'off'}; the chat goes on.")

    # ---- helpers ---------------------------------------------------------------------------

    @property
    def generating(self) -> bool:
        return self.job is not None

    async def notice(self, text: str, *, error: bool = False) -> None:
        await self.query_one(Transcript).add(Notice(text, error=error))

    def refresh_status(self) -> None:
        self.query_one(StatusBar).show(
            self.metrics,
            self.settings,
            generating=self.generating,
            provenance=self.show_provenance,
            context_used=self.context_used,
        )
        self.query_one(SparkRow).show(self.metrics)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel":
            return self.generating
        if action == "copy_last":
            return bool(self.last_answer) or None
        return True

    def _set_job(self, job: ReplyJob | None) -> None:
        self.job = job
        self.refresh_bindings()
        self.refresh_status()

    # ---- sending ---------------------------------------------------------------------------

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        if text.startswith("/"):
            event.input.value = ""
            await self.run_command(text)
            return
        if self.generating:
            self.notify("A reply is still streaming: Esc stops it.", severity="warning")
            return
        event.input.value = ""
        await self.send(text)

    async def send(self, text: str) -> None:
        """Add a user turn and start generating the reply on a worker thread."""
        transcript = self.query_one(Transcript)
        self.conversation.add("user", text)
        await transcript.add(UserMessage(text))
        try:
            params = self.settings.params()
            prompt = self.conversation.prepare(
                self.engine.info, self.engine.tokenize, params.max_tokens
            )
        except LocalspecError as error:
            self.conversation.messages.pop()
            await self.notice(str(error), error=True)
            return
        if prompt.dropped:
            plural = "s" if prompt.dropped != 1 else ""
            await self.notice(
                f"The conversation outgrew the context ({self.engine.info.n_ctx} tokens): "
                f"dropped the {prompt.dropped} oldest message{plural}."
            )
        self.metrics = ReplyMetrics(clock=self.clock)
        self.context_used = len(prompt.tokens)
        self.reply = AssistantMessage(self.show_provenance)
        await transcript.add(self.reply)
        self._job_counter += 1
        job = ReplyJob(
            self._job_counter,
            self.engine,
            prompt.tokens,
            replace(
                params,
                max_tokens=prompt.max_tokens,
                stop=(*params.stop, *self.conversation.stop_strings(self.engine.info)),
            ),
            self.post_message,
        )
        self._set_job(job)
        self.run_worker(job.run, thread=True, group="reply", exit_on_error=False)

    # ---- messages from the worker ----------------------------------------------------------

    async def on_reply_chunk(self, message: ReplyChunk) -> None:
        if self.job is None or message.job_id != self.job.job_id or self.reply is None:
            return
        for n_tokens, stats in message.steps:
            if self.metrics is not None:
                self.metrics.update(n_tokens, stats)
            self.context_used += n_tokens
        await self.reply.append(message.text, message.spans)
        self.query_one(Transcript).follow()
        self.refresh_status()

    def on_reply_segment(self, message: ReplySegment) -> None:
        if self.job is not None and message.job_id == self.job.job_id and self.metrics:
            self.metrics.reset()

    async def on_reply_finished(self, message: ReplyFinished) -> None:
        if self.job is None or message.job_id != self.job.job_id or self.reply is None:
            return
        if message.text:
            self.conversation.add("assistant", message.text)
            self.last_answer = message.text
        else:  # nothing was said: forget the question too, so the roles keep alternating
            self.conversation.messages.pop()
        if message.text and printable(message.text) != self.reply.text:
            await self.reply.replace_text(message.text)
        await self.reply.finish(self._summary(message))
        self.replies_finished += 1
        self._set_job(None)
        self.query_one(Transcript).follow()

    async def on_reply_failed(self, message: ReplyFailed) -> None:
        if self.job is None or message.job_id != self.job.job_id:
            return
        if self.conversation.messages and self.conversation.messages[-1]["role"] == "user":
            self.conversation.messages.pop()
        if self.reply is not None:
            await self.reply.finish("failed")
        await self.notice(f"The reply failed: {message.error}", error=True)
        self._set_job(None)

    def _summary(self, message: ReplyFinished) -> str:
        stats, metrics = message.stats, self.metrics
        parts = [f"{metrics.tokens if metrics else stats.n_tokens} tokens"]
        if metrics is not None and metrics.total_seconds > 0:  # what the status bar shows now
            parts.append(f"{metrics.shown_tokens_per_second(generating=False):.1f} tok/s")
        if stats.drafted:
            parts.append(f"accept {stats.acceptance_rate:.0%}")
        if stats.target_passes:
            parts.append(f"τ {stats.mean_accepted_length:.2f}")
        return " · ".join(parts) + FINISH_NOTES.get(message.finish_reason, "")

    # ---- actions ---------------------------------------------------------------------------

    def action_cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen())

    def _apply_live(self, what: str) -> None:
        """Tell the user what changed; a reply in progress continues with the new settings."""
        if self.job is not None:
            self.job.switch(self.settings.params())
            what += " (applied to this reply from here on)"
        self.notify(what, timeout=2)
        self.refresh_status()

    def action_toggle_speculation(self) -> None:
        self.settings.speculative = not self.settings.speculative
        self._apply_live(f"Speculation {'on' if self.settings.speculative else 'off'}")

    def action_cycle_draft(self) -> None:
        self.settings.draft_max = self.settings.next_draft_max()
        self._apply_live(f"Draft length {self.settings.draft_label()}")

    def action_cycle_temperature(self) -> None:
        self.settings.temperature = self.settings.next_temperature()
        self._apply_live(f"Temperature {self.settings.temperature:g}")

    async def action_toggle_provenance(self) -> None:
        self.show_provenance = not self.show_provenance
        await self.query_one(Transcript).set_provenance(self.show_provenance)
        self.refresh_status()

    async def action_new_chat(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self._set_job(None)
        self.conversation.clear()
        self.metrics, self.reply, self.context_used = None, None, 0
        await self.query_one(Transcript).clear()
        await self.notice("New chat.")
        self.refresh_status()

    def action_copy_last(self) -> None:
        if not self.last_answer:
            self.notify("Nothing to copy yet.", severity="warning")
            return
        self.app.copy_to_clipboard(self.last_answer)
        self.notify(f"Copied the last answer ({len(self.last_answer)} characters).", timeout=2)

    # ---- slash commands --------------------------------------------------------------------

    def switch_exact(self, exact: bool) -> None:
        """Exact mode is a load-time choice: the app loads the models again in it
        (localspec_tui.mode_switch)."""
        if exact == self.engine.info.exact:
            self.notify(f"Exact mode is already {'on' if exact else 'off'}.", timeout=2)
        elif self.generating:
            self.notify("A reply is still streaming: Esc stops it first.", severity="warning")
        else:
            messages = [dict(m) for m in self.conversation.messages]
            self.post_message(self.ModeSwitchAsked(
                ModeSwitch(exact, messages, self.conversation.system_prompt)))

    async def run_command(self, text: str) -> None:
        try:
            command = parse_command(text)
            await self._dispatch(command.name, command.argument)
        except ValueError as error:
            await self.notice(str(error).capitalize(), error=True)

    async def _dispatch(self, name: str, argument: str) -> None:
        settings = self.settings
        if name == "help":
            self.action_help()
        elif name == "new":
            await self.action_new_chat()
        elif name == "copy":
            self.action_copy_last()
        elif name == "colours":
            await self.action_toggle_provenance()
        elif name == "quit":
            self.app.exit()
        elif name == "temp":
            settings.temperature = parse_temperature(argument)
            self._apply_live(f"Temperature {settings.temperature:g}")
        elif name == "k":
            settings.draft_max = parse_draft_max(argument)
            self._apply_live(f"Draft length {settings.draft_label()}")
        elif name == "spec":
            settings.speculative = parse_switch(argument, settings.speculative)
            self._apply_live(f"Speculation {'on' if settings.speculative else 'off'}")
        elif name == "exact":
            self.switch_exact(parse_switch(argument, self.engine.info.exact))
        elif name == "json":
            settings.json_mode = parse_switch(argument, settings.json_mode)
            self.notify(f"JSON replies {'on' if settings.json_mode else 'off'}", timeout=2)
        elif name == "max":
            settings.max_tokens = parse_max_tokens(argument)
            self.notify(f"Replies up to {settings.max_tokens} tokens", timeout=2)
        elif name == "system":
            settings.system_prompt = argument or None
            self.conversation.system_prompt = settings.system_prompt
            await self.notice(
                f"System prompt: {argument}" if argument else "System prompt cleared."
            )
