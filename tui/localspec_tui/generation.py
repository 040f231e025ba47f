"""One assistant reply, generated on a worker thread that posts messages to the UI.

The job iterates the engine's request handle (blocking, so it runs in a thread) and posts a
message per chunk. ``cancel()`` stops it within one speculative step. ``switch(params)``
changes the settings mid-reply: the running request is cancelled and the reply continues from
the tokens already generated (prompt + reply so far) with the new parameters, so speculation
can be toggled live and the difference seen on the same answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from textual.message import Message

from localspec.errors import LocalspecError
from localspec.runtime.engine import Engine, RequestHandle
from localspec.types import FinishReason, GenerationParams, GenerationStats

from .provenance import ProvenanceTracker, Span

POST_INTERVAL = 1 / 30  # seconds between two chunk messages, at most


Step = tuple[int, GenerationStats]  # tokens emitted by one speculative step, running stats after


class ReplyChunk(Message):
    """New text of the reply, its provenance spans, and the steps that produced it.

    Fast models emit hundreds of steps a second; the worker batches them (at most
    ``POST_INTERVAL`` apart) so the UI redraws a few dozen times a second, not per step.
    """

    def __init__(self, job_id: int, text: str, spans: list[Span], steps: list[Step]) -> None:
        super().__init__()
        self.job_id, self.text, self.spans, self.steps = job_id, text, spans, steps


class ReplySegment(Message):
    """The reply continues under new parameters (statistics restart from zero)."""

    def __init__(self, job_id: int, params: GenerationParams) -> None:
        super().__init__()
        self.job_id, self.params = job_id, params


class ReplyFinished(Message):
    def __init__(
        self, job_id: int, text: str, finish_reason: FinishReason, stats: GenerationStats
    ) -> None:
        super().__init__()
        self.job_id, self.text, self.finish_reason, self.stats = job_id, text, finish_reason, stats


class ReplyFailed(Message):
    def __init__(self, job_id: int, error: str) -> None:
        super().__init__()
        self.job_id, self.error = job_id, error


class ReplyJob:
    """Generates one reply; ``run`` blocks and must be called on a worker thread."""

    def __init__(
        self,
        job_id: int,
        engine: Engine,
        prompt_tokens: Sequence[int],
        params: GenerationParams,
        post: Callable[[Message], object],
    ) -> None:
        self.job_id = job_id
        self._engine = engine
        self._prompt = list(prompt_tokens)
        self._params = params
        self._post = post
        self._lock = threading.Lock()
        self._handle: RequestHandle | None = None
        self._cancelled = False
        self._switch_to: GenerationParams | None = None

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._handle is not None:
                self._handle.cancel()

    def switch(self, params: GenerationParams) -> None:
        """Continue this reply with ``params`` (its ``max_tokens`` and ``stop`` are kept)."""
        with self._lock:
            if self._cancelled:
                return
            self._switch_to = replace(params, stop=self._params.stop)
            if self._handle is not None:
                self._handle.cancel()

    def run(self) -> None:
        try:
            self._generate()
        except LocalspecError as error:
            self._post(ReplyFailed(self.job_id, str(error)))
        except Exception as error:  # a bug in the engine: show it, keep the chat alive
            self._post(ReplyFailed(self.job_id, f"{type(error).__name__}: {error}"))

    def _generate(self) -> None:
        tracker = ProvenanceTracker(self._engine.detokenize)
        budget = self._params.max_tokens
        params = self._params
        reply_text = ""
        segment_start = 0  # index in tracker.tokens where the current segment began
        while True:
            remaining = budget - len(tracker.tokens)
            handle = self._engine.submit(
                self._prompt + tracker.tokens, replace(params, max_tokens=remaining)
            )
            with self._lock:
                self._handle = handle
                if self._cancelled or self._switch_to is not None:
                    handle.cancel()
            segment_text = ""
            batch = _Batch()
            for chunk in handle:
                segment_text += chunk.text
                reply_text += chunk.text
                spans = tracker.add(chunk.tokens, chunk.provenance)
                lead = tracker.leading_offset(reply_text)
                batch.text += chunk.text
                batch.spans += [(max(0, a - lead), max(0, b - lead), p) for a, b, p in spans]
                batch.steps.append((len(chunk.tokens), chunk.stats))
                if time.monotonic() - batch.started >= POST_INTERVAL:
                    self._post(batch.message(self.job_id))
                    batch = _Batch()
            result = handle.result()
            held_back = (
                result.text[len(segment_text) :] if result.text.startswith(segment_text) else ""
            )
            if held_back:  # text the engine held back (partial UTF-8 or stop string) at the end
                reply_text += held_back
                batch.text += held_back
            if batch.text or batch.steps:
                self._post(batch.message(self.job_id))
            with self._lock:
                switch, self._switch_to = self._switch_to, None
                self._handle = None
                resume = (
                    result.finish_reason == "cancelled"
                    and switch is not None
                    and not self._cancelled
                    and len(tracker.tokens) < budget
                )
            if resume and switch is not None:
                params = switch
                segment_start = len(tracker.tokens)
                self._post(ReplySegment(self.job_id, switch))
                continue
            if segment_start:
                reply_text = self._joined_text(tracker.tokens, segment_start, result.text)
            self._post(ReplyFinished(self.job_id, reply_text, result.finish_reason, result.stats))
            return

    def _joined_text(self, tokens: list[int], last_start: int, last_text: str) -> str:
        """The text of a reply generated in segments, decoded as one token sequence.

        Each request decodes its own tokens, so a character whose bytes straddle a segment
        boundary would show up as two replacement characters; decoding all tokens at once
        gives the text the target alone would have produced. What the last request cut from
        its end (a stop string) is cut here too.
        """
        full = self._engine.detokenize(tokens)
        last_raw = self._engine.detokenize(tokens[last_start:])
        cut = len(last_raw) - len(last_text) if last_raw.startswith(last_text) else 0
        return full[: len(full) - cut] if cut > 0 else full


class _Batch:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self.text = ""
        self.spans: list[Span] = []
        self.steps: list[Step] = []

    def message(self, job_id: int) -> ReplyChunk:
        return ReplyChunk(job_id, self.text, self.spans, self.steps)
