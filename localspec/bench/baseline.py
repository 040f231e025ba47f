"""`localspec bench --baseline llama-cpp-python`: what users would pick instead, same prompts.

llama-cpp-python runs in a child process (``localspec.bench.llamacpp_baseline``) because it
loads its own libllama, which must not share a process with ``localspec._core`` (docs/design.md,
"Architecture").
The child gets the prompts as localspec's own token ids, so both see identical prompts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from localspec.bench.llamacpp_baseline import PROGRESS
from localspec.bench.report import Report, Row
from localspec.bench.runner import PromptRun

# llama-cpp-python's generate() and prompt lookup; llama.cpp's llama-speculative-simple
# (localspec.bench.llama_speculative).
BASELINES = ("llama-cpp-python", "llama-speculative")
ARMS = ("plain", "prompt-lookup")


@dataclass
class BaselineRow:
    """One category: llama-cpp-python's two arms next to localspec's two arms."""

    label: str
    n_runs: int
    llamacpp_plain_tps: float
    llamacpp_lookup_tps: float
    lookup_drafted: int
    lookup_accepted: int
    lookup_acceptance_rate: float
    localspec_plain_tps: float
    localspec_speculative_tps: float
    plain_vs_plain: float  # localspec plain / llama-cpp-python plain
    speculative_vs_lookup: float  # localspec speculative / llama-cpp-python prompt lookup
    # Prompts whose llama-cpp-python plain output equals localspec's plain output (first
    # repeat), of n_prompts. Not a losslessness check: the two process the prompt in
    # different batch shapes, and last-bit float differences can flip a near-tie.
    plain_outputs_same: int
    n_prompts: int


@dataclass
class Baseline:
    """The baseline's rows, or the one sentence saying why there are none."""

    name: str = "llama-cpp-python"
    error: str | None = None
    llama_cpp_version: str = ""
    num_pred_tokens: int = 0
    max_ngram_size: int = 0
    categories: list[BaselineRow] = field(default_factory=list)
    overall: BaselineRow | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def best_tps(self) -> dict[str, float]:
        """The faster arm's tokens/s per row label ("all" too); none when the baseline failed."""
        if self.error is not None:
            return {}
        rows = self.categories + ([self.overall] if self.overall else [])
        return {r.label: max(r.llamacpp_plain_tps, r.llamacpp_lookup_tps) for r in rows}


def default_timeout(n_runs: int, max_tokens: int) -> float:
    """Generous: 5 minutes to load, plus half a second per token of each arm."""
    return 300.0 + n_runs * 2 * max_tokens * 0.5


def run_child(job: dict[str, Any], timeout: float,
              progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run the child on `job`; returns its JSON, or {"error": one sentence}. ``progress(done,
    total)`` is called as the child reports each finished run (its stderr lines)."""
    command = [sys.executable, "-m", "localspec.bench.llamacpp_baseline"]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    err: list[str] = []

    def read_stderr() -> None:
        assert child.stderr is not None
        for line in child.stderr:
            parts = line.split()
            if len(parts) == 3 and parts[0] == PROGRESS and (parts[1] + parts[2]).isdigit():
                if progress:
                    progress(int(parts[1]), int(parts[2]))
            elif line.strip():
                err.append(line.strip())

    def read_stdout() -> None:
        assert child.stdout is not None
        out.append(child.stdout.read())

    readers = [threading.Thread(target=read_stderr, daemon=True),
               threading.Thread(target=read_stdout, daemon=True)]
    for reader in readers:
        reader.start()
    try:
        assert child.stdin is not None
        child.stdin.write(json.dumps(job))
        child.stdin.close()
        child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        return {"error": f"it did not finish within {timeout:.0f} s"}
    except BrokenPipeError:  # the child ended before reading its job: its stderr says why
        child.wait()
    finally:
        for reader in readers:
            reader.join(timeout=10)
    lines = [line for line in "".join(out).splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        result = None
    if not isinstance(result, dict):
        why = err[-1] if err else f"exit status {child.returncode}"
        return {"error": f"the baseline process failed ({why})"}
    return result


def make_job(model: str, runs: Sequence[PromptRun], prompt_tokens: dict[str, list[int]], *,
             max_tokens: int, repeat: int, n_threads: int, num_pred_tokens: int | None,
             n_gpu_layers: int = -1) -> dict[str, Any]:
    longest = max((len(t) for t in prompt_tokens.values()), default=0)
    return {
        "model": model,
        # Prompt lookup makes llama-cpp-python keep logits for every context position
        # (n_ctx x n_vocab floats), so the context is only as large as the runs need.
        "n_ctx": longest + max_tokens + 16,
        "n_threads": n_threads,
        "n_gpu_layers": n_gpu_layers,
        "max_tokens": max_tokens,
        "repeat": repeat,
        "num_pred_tokens": num_pred_tokens,
        "max_ngram_size": 2,
        "prompts": [{"id": r.prompt.id, "category": r.prompt.category,
                     "tokens": prompt_tokens[r.prompt.id]} for r in runs],
    }


def _tps(runs: Sequence[dict[str, Any]]) -> float:
    """Tokens after the first over the time after the first (see llamacpp_baseline)."""
    seconds = sum(r["generation_seconds"] for r in runs)
    return sum(r["n_tokens"] - 1 for r in runs) / seconds if seconds > 0 else 0.0


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def baseline_row(label: str, child_runs: Sequence[dict[str, Any]], local: Row,
                 plain_tokens: dict[str, list[int]]) -> BaselineRow:
    plain = [r for r in child_runs if r["arm"] == "plain"]
    lookup = [r for r in child_runs if r["arm"] == "prompt-lookup"]
    drafted = sum(r["drafted"] for r in lookup)
    accepted = sum(r["accepted"] for r in lookup)
    plain_tps, lookup_tps = _tps(plain), _tps(lookup)
    first = [r for r in plain if r["repeat"] == 0]
    same = sum(r["tokens"] == plain_tokens.get(r["id"]) for r in first)
    return BaselineRow(
        label=label,
        n_runs=len(lookup),
        llamacpp_plain_tps=plain_tps,
        llamacpp_lookup_tps=lookup_tps,
        lookup_drafted=drafted,
        lookup_accepted=accepted,
        lookup_acceptance_rate=_ratio(accepted, drafted),
        localspec_plain_tps=local.plain_tps,
        localspec_speculative_tps=local.speculative_tps,
        plain_vs_plain=_ratio(local.plain_tps, plain_tps),
        speculative_vs_lookup=_ratio(local.speculative_tps, lookup_tps),
        plain_outputs_same=same,
        n_prompts=len(first),
    )


def summarize_baseline(result: dict[str, Any], report: Report,
                       runs: Sequence[PromptRun]) -> Baseline:
    """Rows per category (in the report's order) and overall, from the child's JSON."""
    if "error" in result:
        return Baseline(error=str(result["error"]))
    child_runs: list[dict[str, Any]] = result["runs"]
    plain_tokens = {r.prompt.id: r.plain_tokens for r in runs}
    rows = [baseline_row(row.label, [c for c in child_runs if c["category"] == row.label], row,
                         plain_tokens) for row in report.categories]
    return Baseline(
        llama_cpp_version=str(result.get("llama_cpp_version", "")),
        num_pred_tokens=int(result.get("num_pred_tokens", 0)),
        max_ngram_size=int(result.get("max_ngram_size", 0)),
        categories=rows,
        overall=baseline_row("all", child_runs, report.overall, plain_tokens),
    )


def run_baseline(model: str, runs: Sequence[PromptRun], prompt_tokens: dict[str, list[int]],
                 report: Report, *, max_tokens: int, repeat: int, n_threads: int,
                 num_pred_tokens: int | None = None, timeout: float | None = None,
                 progress: Callable[[int, int], None] | None = None) -> Baseline:
    """Run llama-cpp-python on the same prompts and lengths and line it up with `report`;
    ``progress(done, total)`` after each of its runs."""
    job = make_job(model, runs, prompt_tokens, max_tokens=max_tokens, repeat=repeat,
                   n_threads=n_threads, num_pred_tokens=num_pred_tokens)
    if timeout is None:
        timeout = default_timeout(len(runs) * repeat, max_tokens)
    return summarize_baseline(run_child(job, timeout, progress), report, runs)
