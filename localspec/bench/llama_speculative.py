"""`localspec bench --baseline llama-speculative`: llama.cpp's own speculative decoding on the
same prompts, by `llama-speculative-simple` built from the llama.cpp that the pinned
llama-cpp-python vendors (`python scripts/llama_speculative_build.py`; docs/bench.md).

Arms, each one process per prompt and repeat (the program decodes one prompt), greedy
(``--temp 0 --top-k 1``), end-of-generation ignored, ``max_tokens`` tokens (the program may
overshoot by a draft), the bench's thread count for both models:
- "draft-simple": the pair's draft model (``-md``) at llama.cpp's defaults (3 tokens a draft,
  no confidence cutoff); only when the drafter names a model;
- "ngram-mod": llama.cpp's n-gram drafter (a hash of the last tokens into a pool shared across
  the run) at its defaults.
The program has no plain arm (``--spec-type none`` fails to start); llama.cpp's plain decoding
is `--baseline llama-cpp-python`'s, whose best arm ``also`` folds into "best vs best".

What is read from the program's log (each line carries a time stamp first): ``decoded N tokens
in S seconds`` (timed after the prompt, as localspec's prefill-excluded tokens/s),
``n_drafted`` and ``n_accept``, and from the drafter's statistics line ``#gen drafts`` (target
passes that verified a draft; printed at ``-lv 4`` only), so the mean accepted length is
(accepted + passes) / passes over those passes.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from localspec.bench.report import Report

PROGRAM = "llama-speculative-simple"
LLAMA_CPP_VERSION = "0.3.36"  # llama-cpp-python's release whose vendored llama.cpp is built
ARM_NAMES = ("draft-simple", "ngram-mod")
DEFAULT_DRAFT_MAX = 3  # llama.cpp's common_params_speculative_draft::n_max
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_FIELD = re.compile(r"\b(n_drafted|n_accept)\s*=\s*(\d+)")
_PASSES = re.compile(r"#gen drafts\s*=\s*(\d+)")


def find_program() -> Path | None:
    """$LOCALSPEC_LLAMA_SPECULATIVE, else where scripts/llama_speculative_build.py puts it."""
    if os.environ.get("LOCALSPEC_LLAMA_SPECULATIVE"):
        path = Path(os.environ["LOCALSPEC_LLAMA_SPECULATIVE"])
    else:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "localspec"
        path = cache / "llama.cpp" / LLAMA_CPP_VERSION / "bin" / PROGRAM
    return path if path.is_file() and os.access(path, os.X_OK) else None


@dataclass
class ArmRun:
    """One run of one arm on one prompt, as the program reported it."""

    tokens: int
    seconds: float
    drafted: int
    accepted: int
    passes: int  # target passes that verified a non-empty draft


def parse_log(log: str) -> ArmRun:
    """The figures of one run from the program's log; ValueError when it has none."""
    decoded = _DECODED.search(log)
    if decoded is None:
        raise ValueError("its log has no 'decoded N tokens' line")
    fields = {name: int(value) for name, value in _FIELD.findall(log)}
    passes = sum(int(n) for n in _PASSES.findall(log))
    return ArmRun(tokens=int(decoded.group(1)), seconds=float(decoded.group(2)),
                  drafted=fields.get("n_drafted", 0), accepted=fields.get("n_accept", 0),
                  passes=passes)


def arm_arguments(arm: str, draft_model: str | None) -> list[str] | None:
    """The program's arguments that make ``arm``; None when the arm cannot run here."""
    if arm == "draft-simple":
        if draft_model is None:
            return None
        return ["--spec-type", "draft-simple", "-md", draft_model,
                "--spec-draft-n-max", str(DEFAULT_DRAFT_MAX)]
    if arm == "ngram-mod":
        return ["--spec-type", "ngram-mod"]
    raise ValueError(f"unknown arm {arm!r}")


# llama.cpp's logger writes from a thread of its own and is leaked at exit (common/log.cpp,
# common_log_main), so a run that ends quickly can lose its last lines: such a run is repeated.
TRIES = 5  # 4 in 5 short runs kept their last lines on a loaded 2-core machine


class SpecPrompt(NamedTuple):
    """One prompt as the program gets it: its rendered text, and its length in tokens
    (localspec's tokenizer, the same vocabulary) for the context size."""

    id: str
    category: str
    text: str
    n_tokens: int


CONTEXT_MARGIN = 64  # tokens beyond prompt + output: a draft's overshoot, BOS


def context_size(n_tokens: int, max_tokens: int) -> int:
    """``-c``: what the run needs (the prompt, the output, a draft past the end), no more."""
    return n_tokens + max_tokens + CONTEXT_MARGIN


def run_arm(program: Path, arm_args: list[str], target: str, prompt: str, *, max_tokens: int,
            n_threads: int, timeout: float, n_ctx: int) -> ArmRun:
    command = [str(program), "-m", target, "-p", prompt, "-n", str(max_tokens), "--ignore-eos",
               "--temp", "0", "--top-k", "1", "--seed", "0", "-c", str(n_ctx),
               "-t", str(n_threads), "-tb", str(n_threads), "-td", str(n_threads),
               "-tbd", str(n_threads), "-ngl", "0", "-lv", "4", *arm_args]
    for attempt in range(TRIES):
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              check=False, errors="replace")
        if done.returncode != 0:
            tail = [line for line in done.stderr.splitlines() if line.strip()]
            raise ValueError(f"exit status {done.returncode}" + (f": {tail[-1][:200]}" if tail
                                                                   else ""))
        try:
            return parse_log(done.stdout + "\n" + done.stderr)
        except ValueError:
            if attempt + 1 == TRIES:
                raise
    raise AssertionError("unreachable")


@dataclass
class ArmFigures:
    """One arm over a category's runs."""

    tokens_per_second: float
    drafted: int
    accepted: int
    acceptance_rate: float
    mean_accepted_length: float  # tokens a target pass that verified a draft emitted


@dataclass
class SpeculativeRow:
    label: str
    arms: dict[str, ArmFigures]
    localspec_plain_tps: float
    localspec_speculative_tps: float
    best_vs_best: float  # localspec's faster arm / llama.cpp's fastest (with ``also``'s)


@dataclass
class SpeculativeBaseline:
    """The rows, or the one sentence saying why there are none."""

    name: str = "llama-speculative"
    error: str | None = None
    program: str = ""
    draft_model: str | None = None
    categories: list[SpeculativeRow] = field(default_factory=list)
    overall: SpeculativeRow | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def figures(runs: Sequence[ArmRun]) -> ArmFigures:
    seconds = sum(r.seconds for r in runs)
    drafted = sum(r.drafted for r in runs)
    accepted = sum(r.accepted for r in runs)
    passes = sum(r.passes for r in runs)
    return ArmFigures(
        tokens_per_second=sum(r.tokens for r in runs) / seconds if seconds > 0 else 0.0,
        drafted=drafted, accepted=accepted,
        acceptance_rate=accepted / drafted if drafted else 0.0,
        mean_accepted_length=(accepted + passes) / passes if passes else 0.0,
    )


def row(label: str, runs: dict[str, list[ArmRun]], plain_tps: float, speculative_tps: float,
        also: float = 0.0) -> SpeculativeRow:
    arms = {arm: figures(arm_runs) for arm, arm_runs in runs.items() if arm_runs}
    best = max([a.tokens_per_second for a in arms.values()] + [also])
    ours = max(plain_tps, speculative_tps)
    return SpeculativeRow(label=label, arms=arms, localspec_plain_tps=plain_tps,
                          localspec_speculative_tps=speculative_tps,
                          best_vs_best=ours / best if best > 0 else 0.0)


def run_llama_speculative(target: str, draft_model: str | None,
                          prompts: Sequence[SpecPrompt], report: Report, *,
                          max_tokens: int, repeat: int, n_threads: int,
                          also: dict[str, float] | None = None,
                          timeout: float = 900.0,
                          progress: Callable[[int, int], None] | None = None
                          ) -> SpeculativeBaseline:
    """Every arm on every prompt, ``repeat`` times in turns, lined up with ``report``'s
    categories. ``also``: the tokens/s of llama.cpp's best other arm per category label
    ("all" too), from llama-cpp-python's baseline; ``progress(done, total)`` after each run."""
    also = also or {}
    program = find_program()
    if program is None:
        return SpeculativeBaseline(error=f"{PROGRAM} is not built: run `python "
                                   "scripts/llama_speculative_build.py` (about 10 minutes), or "
                                   "set LOCALSPEC_LLAMA_SPECULATIVE to its path")
    arms = {arm: arm_arguments(arm, draft_model) for arm in ARM_NAMES}
    runs: dict[str, dict[str, list[ArmRun]]] = {}  # category -> arm -> runs
    total = repeat * len(prompts) * sum(1 for a in arms.values() if a is not None)
    done = 0
    try:
        for r in range(repeat):
            for prompt in prompts:
                order = ARM_NAMES[r % len(ARM_NAMES):] + ARM_NAMES[:r % len(ARM_NAMES)]
                for arm in order:
                    arm_args = arms[arm]
                    if arm_args is None:
                        continue
                    result = run_arm(program, arm_args, target, prompt.text,
                                     max_tokens=max_tokens, n_threads=n_threads, timeout=timeout,
                                     n_ctx=context_size(prompt.n_tokens, max_tokens))
                    runs.setdefault(prompt.category, {}).setdefault(arm, []).append(result)
                    done += 1
                    if progress:
                        progress(done, total)
    except (ValueError, OSError, subprocess.TimeoutExpired) as error:
        return SpeculativeBaseline(error=f"{PROGRAM} failed ({error})", program=str(program))
    everything: dict[str, list[ArmRun]] = {}
    for by_arm in runs.values():
        for arm, arm_runs in by_arm.items():
            everything.setdefault(arm, []).extend(arm_runs)
    return SpeculativeBaseline(
        program=str(program), draft_model=draft_model,
        categories=[row(c.label, runs.get(c.label, {}), c.plain_tps, c.speculative_tps,
                        also.get(c.label, 0.0)) for c in report.categories],
        overall=row("all", everything, report.overall.plain_tps,
                    report.overall.speculative_tps, also.get("all", 0.0)),
    )
