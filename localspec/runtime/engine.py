"""The engine: one thread owns the llama contexts; callers submit requests and read queues.

    engine = Engine.load("target.gguf", draft="ngram")
    result = engine.generate("The capital of France is", max_tokens=32, temperature=0)
    for chunk in engine.stream("Once upon a time"):
        print(chunk.text, end="")

Every generation runs entirely in C++ (``localspec._core``) with the GIL released; the core
calls back once per speculative step with the emitted chunk. The server and the TUI use
``submit`` and read the returned handle, which is an iterator of chunks. Up to
``LoadOptions.parallel`` generations run together, sharing each target pass
(localspec.runtime.engine_loop).
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from localspec import _core
from localspec.drafter_spec import DrafterSpec
from localspec.errors import (
    EngineClosedError,
    InvalidParameterError,
    LocalspecError,
    QueueFullError,
)
from localspec.runtime.convert import params_to_core
from localspec.runtime.engine_loop import EngineLoop, Job, PassReport
from localspec.runtime.handle import HandleListener, RequestHandle
from localspec.runtime.loading import LoadOptions, open_core
from localspec.runtime.rpc import stuck_worker_error
from localspec.runtime.shared_lock import SharedLock
from localspec.runtime.supervision import WorkerSupervision
from localspec.text.grammar_check import (
    DEFAULT_LIMITS,
    GrammarError,
    GrammarLimits,
    check_grammar,
    remember_checked,
    was_checked,
)
from localspec.types import Chunk, EngineInfo, GenerationParams, GenerationResult

_T = TypeVar("_T")

__all__ = ["Engine", "HandleListener", "RequestHandle"]


class Engine(WorkerSupervision):
    """A loaded target (+ drafter) served by one worker thread.

    The engine thread loads the models, runs every llama.cpp computation and frees the
    contexts. This matters for speed, not only for safety: llama.cpp's CPU worker threads
    (OpenMP) belong to the thread that first computes, and a second thread computing with the
    same process's backend runs ~35% slower on a 2-core machine.
    """

    def __init__(self, options: LoadOptions, max_queue: int = 64) -> None:
        options = options.with_threads()  # the count this engine runs with, decided once
        self.options = options
        self._max_queue = max_queue
        self._closed = False
        self._lock = threading.Lock()
        self._pending = 0
        self._pass_observers: list[Callable[[PassReport], None]] = []
        self._live: weakref.WeakSet[RequestHandle] = weakref.WeakSet()
        self._broken: LocalspecError | None = None  # RPC: a worker was lost (docs/rpc.md)
        self._reloading = False  # RPC: a new engine thread loads the model again
        self._watching = True  # RPC: the watcher supervises the current engine thread
        self._stopped = threading.Event()
        # The text helpers run on the callers' threads: this lock keeps the core they read from
        # being closed under them. A core whose engine thread ended after a lost RPC worker is
        # retired, not closed: its vocabulary serves them until the next core is in place.
        self._text_lock = SharedLock()
        self._retired: list[_core.Core] = []
        loaded = self._start_thread(Job(lambda: open_core(options)))
        thread = self._thread
        try:
            core, info = self._await_load(loaded)  # a load error is raised here, in the caller
        except BaseException:
            if thread is not None and stuck_worker_error(options.rpc) is None:
                thread.join()  # (a thread that lost a worker mid-load waits forever)
            raise
        self._core: _core.Core = core
        self.info: EngineInfo = info
        if options.rpc:
            threading.Thread(target=self._watch_workers, name="localspec-rpc-watch",
                             daemon=True).start()

    @classmethod
    def load(
        cls,
        target: str | Path,
        draft: str | Path | DrafterSpec = "ngram",
        *,
        max_queue: int = 64,
        **options: Any,
    ) -> Engine:
        """Load a target GGUF and a drafter: a DrafterSpec or its spelling (``"ngram"``,
        ``"none"``, a GGUF path or ``"hybrid:PATH"``; localspec.drafter_spec).

        ``options`` are LoadOptions' fields (``n_ctx``, ``n_threads``, ``exact``, ``parallel``
        and the rest; localspec.runtime.loading documents each), which own their defaults and
        checks.
        """
        spec = draft if isinstance(draft, DrafterSpec) else DrafterSpec.parse(str(draft))
        return cls(LoadOptions(target=str(target), draft=spec, **options), max_queue=max_queue)

    # ---- requests ---------------------------------------------------------------------------

    def submit(
        self, prompt: str | Sequence[int], params: GenerationParams | None = None, *,
        listener: HandleListener | None = None, **overrides: Any
    ) -> RequestHandle:
        """Queue a generation. Raises QueueFullError when ``max_queue`` requests are waiting.
        ``listener``: receives the chunks and the end on the engine thread (else iterate the
        handle)."""
        params = replace(params or GenerationParams(), **overrides)
        if isinstance(params.stop, list):
            params = replace(params, stop=tuple(params.stop))
        params.validate()
        if params.grammar is not None and not was_checked(params.grammar, self.info.n_vocab):
            self.check_grammar(params.grammar)  # the server's preparation checked its own
        if params.exact and not self.info.exact:
            raise InvalidParameterError(
                "exact=true asks for output bit-identical to plain decoding, but this engine was "
                "loaded in default mode; load it in exact mode (--exact, Engine.load(exact=True))."
            )
        handle = RequestHandle(prompt, params, listener)
        if params.prediction:  # tokenized here, on the caller's thread, not the engine's
            handle.prediction = self.prediction_tokens(params.prediction)
        with self._lock:
            self._check_open()
            if self._pending >= self._max_queue:
                raise QueueFullError(
                    f"{self._pending} requests are already waiting; retry when one has finished."
                )
            self._pending += 1
            self._live.add(handle)
            self._requests.put(handle)
        return handle

    def prediction_tokens(self, prediction: str | Sequence[int]) -> list[int]:
        """A prediction's tokens (text is tokenized as the output would be: no BOS, specials as
        text); InvalidParameterError when they cannot fit the context or are not in the
        vocabulary. Safe from any thread."""
        n_ctx, n_vocab = self.info.n_ctx, self.info.n_vocab
        if isinstance(prediction, str):
            tokens = self.tokenize(prediction, add_special=False, parse_special=False)
        else:
            tokens = list(prediction)
            if any(not 0 <= t < n_vocab for t in tokens):
                raise InvalidParameterError(
                    f"prediction=[...] is invalid: token ids must be in [0, {n_vocab}).",
                    param="prediction")
        if len(tokens) > n_ctx:
            raise InvalidParameterError(
                f"prediction has {len(tokens)} tokens but the context holds only {n_ctx}; send "
                "a shorter prediction or raise the context size (--ctx).", param="prediction")
        return tokens

    def generate(
        self, prompt: str | Sequence[int], params: GenerationParams | None = None, **overrides: Any
    ) -> GenerationResult:
        return self.submit(prompt, params, **overrides).result()

    def stream(
        self, prompt: str | Sequence[int], params: GenerationParams | None = None, **overrides: Any
    ) -> Iterator[Chunk]:
        """Yield chunks as they are generated; leaving the loop early cancels the generation."""
        handle = self.submit(prompt, params, **overrides)
        try:
            yield from handle
        finally:
            handle.cancel()

    def observe_passes(self, observer: Callable[[PassReport], None]) -> None:
        """Call ``observer`` on the engine thread after every target pass (metrics)."""
        self._pass_observers.append(observer)

    @property
    def queue_depth(self) -> int:
        """Requests submitted and not yet finished (including the running ones)."""
        with self._lock:
            return self._pending

    def next_token_logits(self, tokens: Sequence[int], batch_rows: int = 1) -> np.ndarray:
        """The target's raw logits for the token after `tokens`, as plain decoding computes them
        (or, with ``batch_rows`` > 1, as the last row of a verification batch over the last
        ``batch_rows`` tokens). Runs on the engine thread."""
        return self._call(lambda: self._core.next_token_logits(list(tokens), batch_rows))

    def pass_logits(self, tokens: Sequence[int], rows: int) -> np.ndarray:
        """Every row's logits ([rows, n_vocab]) of one target pass over the last ``rows`` of
        ``tokens`` (the rest from the cache). Runs on the engine thread."""
        return self._call(lambda: self._core.pass_logits(list(tokens), rows))

    def pass_seconds(self, context: Sequence[int], max_rows: int, repeats: int = 5) -> list[float]:
        """Median seconds of a greedy verification pass over the last r tokens of `context`, for
        r = 1 .. max_rows (index r; index 0 is 0.0). Runs on the engine thread."""
        return self._call(lambda: self._core.pass_seconds(list(context), max_rows, repeats))

    def warm_up(self) -> None:
        """Measure the target's pass costs now (start-up calibration, ~1-3 s on a CPU) rather
        than in the first drafting request: ``serve`` and ``chat`` call it after loading. No-op
        without a drafter or once measured (or restored). Runs on the engine thread."""
        context = self.tokenize("Speculative decoding drafts tokens and checks them in one pass.")
        self._call(lambda: self._core.warm_up(context))

    def last_logits_head(self) -> str:
        """Which head computed the target's last logits: "localspec-q8_0", "localspec-q6_k" or
        "llama.cpp"."""
        return self._call(self._core.last_logits_head)

    def replay_greedy(self, prompt: Sequence[int], result: GenerationResult,
                      params: GenerationParams | None = None) -> _core.ReplayOutcome:
        """Recompute a greedy `result` with the target alone, in the same batch shapes, from a
        clean cache: ``first_mismatch``, the index of the first token that is not the target's
        argmax (shaped by ``params``' penalties and grammar, as generation shaped it) or -1, and
        ``passes``, the passes it ran (every pass of `result`: it goes on past a mismatch)."""
        shaping = params_to_core(params or GenerationParams(), list(prompt))
        return self._call(
            lambda: self._core.replay_greedy(
                list(prompt), list(result.tokens), result.pass_rows, result.pass_emitted, shaping
            )
        )

    def learned(self) -> _core.ControllerMemory:
        """What the draft-length controller has learned so far (it carries over from request to
        request; localspec.runtime.learned saves it between runs). Runs on the engine thread."""
        return self._call(self._core.controller_memory)

    def restore_learned(self, memory: _core.ControllerMemory) -> None:
        """Start the controller from saved memory (entries of the wrong shape are ignored)."""
        self._call(lambda: self._core.restore_controller_memory(memory))

    def _call(self, fn: Callable[[], _T]) -> _T:
        job = Job(fn)
        with self._lock:
            self._check_open()
            self._requests.put(job)
        return job.future.result()

    def _check_open(self) -> None:
        """Under the lock, before queueing: refuse a closed engine; after a lost RPC worker,
        start loading the model again (what is queued waits for it)."""
        if self._closed:
            raise EngineClosedError("The engine is closed; load a new one.")
        if self._broken is not None:
            self._broken, self._reloading = None, True
            self._start_thread(Job(self._reload))

    # ---- text helpers (safe from any thread: they do not touch the contexts) ----------------

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        with self._text_lock.shared():
            return self._core.tokenize(text, add_special, parse_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        with self._text_lock.shared():
            return self._core.detokenize(list(tokens))

    def token_text(self, token: int) -> str:
        with self._text_lock.shared():
            return self._core.token_text(token)

    def check_grammar(self, gbnf: str, limits: GrammarLimits = DEFAULT_LIMITS,
                      param: str = "grammar") -> None:
        """Raise GrammarError (an InvalidParameterError naming ``param``) when a GBNF grammar
        does not parse or passes ``limits``: localspec's check first (localspec.text.
        grammar_check), so that llama.cpp's parser only meets grammars it accepts, then
        llama.cpp's own (which also resolves ``<text>`` token references)."""
        shape = check_grammar(gbnf, self.info.n_vocab, limits, param)
        for text in dict.fromkeys(shape.token_texts):
            if len(self.tokenize(text, add_special=False, parse_special=True)) != 1:
                raise GrammarError(f"The grammar is invalid: the token reference "
                                   f"{text[:60]!r} is not exactly one token of this model.", param)
        with self._text_lock.shared():
            try:
                seconds = self._core.check_grammar(gbnf)
            except InvalidParameterError as error:
                raise GrammarError(str(error), param) from None
        if seconds > limits.max_mask_seconds:
            raise GrammarError(
                f"The grammar is too costly: checking the model's {self.info.n_vocab} tokens "
                f"against it takes {seconds:.2f} s, more than this server's limit of "
                f"{limits.max_mask_seconds:g} s (--max-grammar-mask-seconds); use fewer "
                "alternatives.", param)
        remember_checked(gbnf, self.info.n_vocab, seconds)

    # ---- lifecycle -----------------------------------------------------------------------

    @property
    def status(self) -> str:
        """"ok"; with RPC workers also "worker_lost" (``failure`` says why; the next request
        loads the model again) or "reloading"."""
        self._check_workers()
        with self._lock:
            return "worker_lost" if self._broken else "reloading" if self._reloading else "ok"

    @property
    def failure(self) -> str | None:
        """Why the engine cannot serve now (a lost RPC worker), or None."""
        self._check_workers()
        with self._lock:
            return None if self._broken is None else str(self._broken)

    @property
    def closed(self) -> bool:
        """Whether close() ran: a closed engine refuses requests."""
        return self._closed

    def close(self) -> None:
        """Finish the running requests, fail queued ones, and free the models."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stopped.set()
            thread, requests = self._thread, self._requests
        if thread is None:  # its engine thread was lost with an RPC worker
            self._close_retired()
            return
        requests.put(None)
        while thread.is_alive():  # the engine thread frees the contexts on its way out
            thread.join(0.25)
            if stuck_worker_error(self.options.rpc) is not None:
                return  # ... unless a lost worker left it waiting forever

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the engine thread ---------------------------------------------------------------

    def _start_thread(self, load: Job) -> Job:
        """A new engine thread (under the lock, or before any other thread sees the engine):
        it runs ``load``, then serves its own queue."""
        requests: queue.Queue[RequestHandle | Job | None] = queue.Queue()
        self._requests = requests
        self._thread: threading.Thread | None = threading.Thread(
            target=self._serve, args=(load, requests), name="localspec-engine", daemon=True
        )
        self._thread.start()
        return load

    def _serve(self, load: Job, requests: queue.Queue[RequestHandle | Job | None]) -> None:
        load.run()
        error = load.future.exception()
        if error is not None:
            self._load_failed(requests, error)
            return
        core, info = load.future.result()
        EngineLoop(core, info, requests, self._request_done, self._pass_observers).run()
        with self._lock:
            lost = not self._closed and self._thread is not threading.current_thread()
            if lost:
                self._retired.append(core)
        if not lost:
            with self._text_lock.alone():
                core.close()  # the engine thread frees the contexts (not those on a lost worker)

    def _load_failed(self, requests: queue.Queue[Any], error: BaseException) -> None:
        """A (re)load failed: what waits for it fails with the same error."""
        with self._lock:
            if self._thread is threading.current_thread():
                self._thread, self._reloading, self._watching = None, False, False
                self._broken = error if isinstance(error, LocalspecError) else LocalspecError(
                    str(error))
        while True:
            try:
                item = requests.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Job):
                item.future.set_exception(error)
            elif item is not None and item._finish(None, error):
                self._request_done()

    def _request_done(self) -> None:
        with self._lock:
            self._pending -= 1
