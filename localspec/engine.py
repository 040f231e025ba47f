"""The engine: one thread owns the llama contexts; callers submit requests and read queues.

    engine = Engine.load("target.gguf", draft="ngram")
    result = engine.generate("The capital of France is", max_tokens=32, temperature=0)
    for chunk in engine.stream("Once upon a time"):
        print(chunk.text, end="")

Every generation runs entirely in C++ (``localspec._core``) with the GIL released; the core
calls back once per speculative step with the emitted chunk. The server and the TUI use
``submit`` and read the returned handle, which is an iterator of chunks. Up to
``LoadOptions.parallel`` generations run together, sharing each target pass
(localspec.engine_loop).
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from localspec import _core
from localspec.convert import params_to_core
from localspec.drafter_spec import DrafterSpec
from localspec.engine_loop import EngineLoop, Job, PassReport
from localspec.errors import EngineClosedError, LocalspecError, QueueFullError, RemoteWorkerError
from localspec.loading import LoadOptions, open_core
from localspec.types import Chunk, EngineInfo, GenerationParams, GenerationResult

_DONE = object()
_T = TypeVar("_T")


class HandleListener(Protocol):
    """Takes a handle's events as they happen, on the engine thread, instead of its queue (the
    server's bridge to asyncio: localspec.server.bridge). Must return at once. (The end of a
    generation whose RPC worker was lost mid-pass comes from the engine's watcher thread.)"""

    def on_chunk(self, chunk: Chunk) -> None: ...

    def on_end(self, result: GenerationResult | None, error: BaseException | None) -> None: ...


class RequestHandle:
    """One submitted generation: iterate for chunks, ``result()`` for the whole answer (or give
    ``submit`` a HandleListener, which then receives the chunks instead)."""

    def __init__(self, prompt: str | Sequence[int], params: GenerationParams,
                 listener: HandleListener | None = None) -> None:
        self.prompt = prompt
        self.params = params
        self._listener = listener
        self._chunks: queue.Queue[Any] = queue.Queue()
        self._cancel = threading.Event()
        self._result: GenerationResult | None = None
        self._error: BaseException | None = None
        self._finished = threading.Event()

    def cancel(self) -> None:
        """Ask the engine to stop this generation; it stops within one step."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def __iter__(self) -> Iterator[Chunk]:
        while True:
            item = self._chunks.get()
            if item is _DONE:
                break
            yield item
        if self._error is not None:
            raise self._error

    def result(self, timeout: float | None = None) -> GenerationResult:
        """Block until the generation ends and return it (raises its error, if any)."""
        if not self._finished.wait(timeout):
            raise TimeoutError("generation did not finish in time")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    # Called on the engine thread only.
    def _on_chunk(self, chunk: Chunk) -> bool:
        if self._listener is not None:
            self._listener.on_chunk(chunk)
        else:
            self._chunks.put(chunk)
        return not self._cancel.is_set()

    def _finish(self, result: GenerationResult | None, error: BaseException | None) -> None:
        self._result, self._error = result, error
        self._finished.set()
        if self._listener is not None:
            self._listener.on_end(result, error)
        else:
            self._chunks.put(_DONE)


class Engine:
    """A loaded target (+ drafter) served by one worker thread.

    The engine thread loads the models, runs every llama.cpp computation and frees the
    contexts. This matters for speed, not only for safety: llama.cpp's CPU worker threads
    (OpenMP) belong to the thread that first computes, and a second thread computing with the
    same process's backend runs ~35% slower on a 2-core machine.
    """

    def __init__(self, options: LoadOptions, max_queue: int = 64) -> None:
        self._requests: queue.Queue[RequestHandle | Job | None] = queue.Queue()
        self._max_queue = max_queue
        self._closed = False
        self._lock = threading.Lock()
        self._pending = 0
        self._pass_observers: list[Callable[[PassReport], None]] = []
        loaded: Job = Job(lambda: open_core(options))
        self._thread = threading.Thread(
            target=self._serve, args=(loaded,), name="localspec-engine", daemon=True
        )
        self._thread.start()
        try:
            core, info = loaded.future.result()  # a load error is raised here, in the caller
        except BaseException:
            self._thread.join()
            raise
        self._core: _core.Core = core
        self.info: EngineInfo = info
        self.options = options
        self._live: weakref.WeakSet[RequestHandle] = weakref.WeakSet()
        self._broken: LocalspecError | None = None
        self._stopped = threading.Event()
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

        ``options`` are LoadOptions' fields, which own their defaults and checks: ``n_ctx``,
        ``n_threads``, ``n_gpu_layers`` (target layers to offload, -1: all),
        ``n_gpu_layers_draft``, ``draft_sampling`` (a draft model samples its tokens from q at
        temperature > 0, else drafts greedily), ``draft_p_min`` (a draft model stops drafting
        when its most likely token is below this probability), ``fast_head`` (logits from
        localspec's Q8_0/Q6_K CPU head where it applies), ``kv_type``, ``exact`` (batch-invariant
        target passes, so speculative output equals plain output bit for bit: docs/exact.md),
        ``parallel`` (generations that share each target pass: localspec.engine_loop) and
        ``verbose``.
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
        handle = RequestHandle(prompt, params, listener)
        with self._lock:
            if self._broken is not None:
                raise self._broken
            if self._closed:
                raise EngineClosedError("The engine is closed; load a new one.")
            if self._pending >= self._max_queue:
                raise QueueFullError(
                    f"{self._pending} requests are already waiting; retry when one has finished."
                )
            self._pending += 1
            self._live.add(handle)
            self._requests.put(handle)
        return handle

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

    def last_logits_head(self) -> str:
        """Which head computed the target's last logits: "localspec-q8_0", "localspec-q6_k" or
        "llama.cpp"."""
        return self._call(self._core.last_logits_head)

    def replay_greedy(self, prompt: Sequence[int], result: GenerationResult,
                      params: GenerationParams | None = None) -> int:
        """Recompute a greedy `result` with the target alone, in the same batch shapes, from a
        clean cache: the index of the first token that is not the target's argmax (shaped by
        ``params``' penalties and grammar, as generation shaped it), or -1."""
        shaping = params_to_core(params or GenerationParams(), list(prompt))
        return self._call(
            lambda: self._core.replay_greedy(
                list(prompt), list(result.tokens), result.pass_rows, result.pass_emitted, shaping
            )
        )

    def learned(self) -> _core.ControllerMemory:
        """What the draft-length controller has learned so far (it carries over from request to
        request; localspec.learned saves it between runs). Runs on the engine thread."""
        return self._call(self._core.controller_memory)

    def restore_learned(self, memory: _core.ControllerMemory) -> None:
        """Start the controller from saved memory (entries of the wrong shape are ignored)."""
        self._call(lambda: self._core.restore_controller_memory(memory))

    def _call(self, fn: Callable[[], _T]) -> _T:
        job = Job(fn)
        with self._lock:
            if self._broken is not None:
                raise self._broken
            if self._closed:
                raise EngineClosedError("The engine is closed; load a new one.")
            self._requests.put(job)
        return job.future.result()

    # ---- text helpers (safe from any thread: they do not touch the contexts) ----------------

    def tokenize(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        return self._core.tokenize(text, add_special, parse_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._core.detokenize(list(tokens))

    def token_text(self, token: int) -> str:
        return self._core.token_text(token)

    def check_grammar(self, gbnf: str) -> None:
        """Raise InvalidParameterError when a GBNF grammar does not parse."""
        self._core.check_grammar(gbnf)

    # ---- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Finish the running requests, fail queued ones, and free the models."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stopped.set()
        self._requests.put(None)
        self._thread.join()  # the engine thread frees the contexts on its way out

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the engine thread ---------------------------------------------------------------

    def _serve(self, load: Job) -> None:
        load.run()
        if load.future.exception() is not None:
            return
        core, info = load.future.result()
        EngineLoop(core, info, self._requests, self._request_done, self._pass_observers).run()
        core.close()  # the engine thread frees the contexts

    def _watch_workers(self) -> None:
        """With RPC workers: a worker lost in the middle of a pass leaves that pass, and so the
        engine thread, waiting forever (the core parks ggml's connection thread instead of
        letting ggml abort: csrc/rpc.h). Fail what waits and refuse what comes."""
        while not self._stopped.wait(0.25):
            failure = _core.rpc_failure(list(self.options.rpc))
            if failure:
                error = RemoteWorkerError(failure[0].upper() + failure[1:])
                with self._lock:
                    self._broken, self._closed = error, True
                    handles = [h for h in self._live if not h._finished.is_set()]
                for handle in handles:
                    handle._finish(None, error)
                return

    def _request_done(self) -> None:
        with self._lock:
            self._pending -= 1
