"""llama-cpp-python's own generation, timed like localspec's, for `localspec bench --baseline`.

Runs as its own process (``python -m localspec.bench.llamacpp_baseline``): ``import llama_cpp``
must never share a process with ``localspec._core``, or two copies of libllama are mapped
(docs/design.md, "Architecture"). Reads one JSON job on stdin and writes one JSON object on stdout:

    job:    {"model": PATH, "n_ctx": N, "n_threads": N, "n_gpu_layers": N, "max_tokens": N,
             "repeat": N, "num_pred_tokens": N | null, "max_ngram_size": N,
             "prompts": [{"id": ID, "category": C, "tokens": [ids...]}, ...]}
    result: {"llama_cpp_version": V, "num_pred_tokens": N, "max_ngram_size": N,
             "runs": [{"id", "category", "arm", "repeat", "n_tokens", "time_to_first_token",
                       "generation_seconds", "tokens_per_second", "drafted", "accepted",
                       "tokens"}, ...]}
            or {"error": "one sentence"} (exit status 1).

Two arms: "plain" (``Llama.generate``, greedy: temperature 0, top_k 1) and "prompt-lookup"
(the same, with ``LlamaPromptLookupDecoding`` as ``draft_model``). ``Llama.generate`` does not
stop at end-of-generation, so both arms produce exactly ``max_tokens`` tokens. What is timed:
the generator yields each token as it is sampled; the time up to the first token (prompt
processing + first sample) is ``time_to_first_token``, and tokens/s counts the remaining
``max_tokens - 1`` tokens over the time from the first token to the last one. Each of those
tokens costs one decode step, as each localspec token does in its ``generation_seconds``.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time
from typing import Any, cast

# llama-cpp-python's README: "10 is the default and generally good for gpu, 2 performs better
# for cpu-only machines".
CPU_NUM_PRED_TOKENS = 2
GPU_NUM_PRED_TOKENS = 10


class _CountingLookup:
    """Wraps a draft model and records each draft with the sequence length it continues."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.drafts: list[tuple[int, list[int]]] = []

    def __call__(self, input_ids: Any, /, **kwargs: Any) -> Any:
        out = self.inner(input_ids, **kwargs)
        self.drafts.append((int(input_ids.shape[0]), [int(t) for t in out]))
        return out


def count_accepted(drafts: list[tuple[int, list[int]]], sequence: list[int]) -> tuple[int, int]:
    """(drafted, accepted): a draft made after `start` tokens is accepted up to its first
    token that differs from what was actually generated at that position. Drafts past the
    end of `sequence` (the last step, cut by max_tokens) are left out."""
    drafted = accepted = 0
    for start, draft in drafts:
        draft = draft[: max(0, len(sequence) - start)]
        drafted += len(draft)
        for i, token in enumerate(draft):
            if sequence[start + i] != token:
                break
            accepted += 1
    return drafted, accepted


def _timed_generation(llm: Any, tokens: list[int], max_tokens: int) -> dict[str, Any]:
    llm.reset()  # no prompt-cache reuse between runs: every run processes its whole prompt
    out: list[int] = []
    start = time.perf_counter()
    first = last = start
    for token in llm.generate(tokens, top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
        last = time.perf_counter()
        if not out:
            first = last
        out.append(int(token))
        if len(out) >= max_tokens:
            break
    seconds = last - first
    return {
        "n_tokens": len(out),
        "time_to_first_token": first - start,
        "generation_seconds": seconds,
        "tokens_per_second": (len(out) - 1) / seconds if seconds > 0 else 0.0,
        "tokens": out,
    }


def _run_arm(llm: Any, lookup: _CountingLookup | None, prompt: dict[str, Any],
             max_tokens: int) -> dict[str, Any]:
    if lookup is not None:
        lookup.drafts.clear()
    run = _timed_generation(llm, list(prompt["tokens"]), max_tokens)
    drafted = accepted = 0
    if lookup is not None:
        drafted, accepted = count_accepted(lookup.drafts, list(prompt["tokens"]) + run["tokens"])
    return {"id": prompt["id"], "category": prompt["category"], "drafted": drafted,
            "accepted": accepted, **run}


GGML_GPU_DEVICE_TYPES = (1, 2)  # enum ggml_backend_dev_type: CPU 0, GPU 1, IGPU 2, ACCEL 3


def has_gpu(llama_cpp: Any) -> bool:
    """Whether ggml lists a GPU device. ``llama_supports_gpu_offload()`` is no answer: a CPU
    build with the RPC backend (the tests' build) says yes without any GPU."""
    lib = llama_cpp.llama_cpp._lib
    try:
        count, get, kind = (lib.ggml_backend_dev_count, lib.ggml_backend_dev_get,
                            lib.ggml_backend_dev_type)
    except AttributeError:
        return bool(llama_cpp.llama_supports_gpu_offload())
    count.restype, get.restype, get.argtypes = ctypes.c_size_t, ctypes.c_void_p, [ctypes.c_size_t]
    kind.restype, kind.argtypes = ctypes.c_int, [ctypes.c_void_p]
    return any(kind(get(i)) in GGML_GPU_DEVICE_TYPES for i in range(count()))


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Load both arms, warm them up, and run every prompt plain then with prompt lookup
    (the order flips on every repeat, as in localspec's own runner)."""
    # docs/design.md, "Architecture": never two libllama copies in a process
    if "localspec._core" in sys.modules:
        raise RuntimeError("the baseline must run in a process without localspec._core")
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    num_pred = job.get("num_pred_tokens")
    if num_pred is None:
        num_pred = GPU_NUM_PRED_TOKENS if has_gpu(llama_cpp) else CPU_NUM_PRED_TOKENS
    ngram = int(job.get("max_ngram_size", 2))
    lookup = _CountingLookup(
        LlamaPromptLookupDecoding(max_ngram_size=ngram, num_pred_tokens=num_pred))
    threads = job["n_threads"]
    common = {"n_ctx": job["n_ctx"], "n_threads": threads, "n_threads_batch": threads,
              "n_gpu_layers": job.get("n_gpu_layers", -1), "verbose": False}
    draft_model = cast(Any, lookup)  # duck-typed: llama_cpp only calls its draft model
    arms = {"plain": (llama_cpp.Llama(job["model"], **common), None),
            "prompt-lookup": (llama_cpp.Llama(job["model"], draft_model=draft_model, **common),
                              lookup)}
    max_tokens = int(job["max_tokens"])
    if job["prompts"]:
        for llm, counter in arms.values():  # warm-up
            _run_arm(llm, counter, job["prompts"][0], min(8, max_tokens))
    runs: list[dict[str, Any]] = []
    repeat = int(job.get("repeat", 1))
    total = len(job["prompts"]) * repeat * len(arms)
    for prompt in job["prompts"]:
        for r in range(repeat):
            order = list(arms.items())
            if r % 2:
                order.reverse()
            for arm, (llm, counter) in order:
                runs.append({"arm": arm, "repeat": r, **_run_arm(llm, counter, prompt, max_tokens)})
                report_progress(len(runs), total)
    return {"llama_cpp_version": llama_cpp.__version__, "num_pred_tokens": num_pred,
            "max_ngram_size": ngram, "runs": runs}


PROGRESS = "progress"  # a stderr line "progress DONE TOTAL" after each run, read by the parent


def report_progress(done: int, total: int) -> None:
    print(f"{PROGRESS} {done} {total}", file=sys.stderr, flush=True)


def main() -> int:
    try:
        result = run_job(json.load(sys.stdin))
    except ImportError as error:
        result = {"error": f"llama-cpp-python is not importable ({error})"}
    except Exception as error:  # noqa: BLE001 - reported to the parent as one sentence
        result = {"error": f"{type(error).__name__}: {error}"}
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
