"""What the draft-length controller learned, saved between runs of `localspec run`.

The engine keeps the controller's memory (acceptance by draft kind and position, pass costs by
row count, draft costs) across the requests of one process; this module writes it to the cache
directory so that the next `localspec run` of the same model + drafter starts from it instead of
from nothing (docs/design.md, "The controller"). The file is keyed by everything that changes
what was learned: the target and draft files (path, size, modification time), the drafter, the
head, the thread count and the context size. A file that cannot be read is ignored (and
replaced on the next save): statistics are a hint, never a reason to fail.

Timings learned on a busy machine are wrong for a quiet one (a shared CPU makes passes look
cheap or dear at random), so a file records when it was saved, how noisy the pass timings were
(the controller's ``timing_noise``) and the load average per core; on load, the pass and draft
costs of a noisy run are dropped (the engine times them afresh) and only its acceptance, which
no load changes, is reused. Whoever reuses a file says so (``SavedStats.note``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec import _core
from localspec.drafter_spec import DrafterSpec
from localspec.runtime.loading import LoadOptions

if TYPE_CHECKING:
    from localspec.runtime.engine import Engine
from localspec.models.sources import cache_dir

FORMAT = 2  # 1: no date nor noise (not reused)
# Above this timing noise (the controller's, csrc/engine/controller.cpp kNoisyTimings) the saved
# pass costs are not reused.
NOISY_TIMINGS = 0.25


@dataclass(frozen=True)
class SavedStats:
    """Statistics found in the cache: when they were saved, from how noisy a run, and whether
    their timings were reused (else acceptance only)."""

    saved_at: float  # Unix time
    timing_noise: float
    load_per_core: float | None  # the 1-minute load average per usable core at the save
    timings_reused: bool

    def note(self) -> str:
        """One phrase for summaries: "statistics from 2026-11-29 05:40 UTC reused"."""
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.saved_at))
        if self.timings_reused:
            return f"statistics from {when} reused"
        return (f"statistics from {when}: timings ignored (saved from a noisy run: pass costs "
                f"off by {self.timing_noise:.0%} on average), acceptance reused")

    def to_dict(self) -> dict[str, Any]:
        return {"saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.saved_at)),
                "timing_noise": round(self.timing_noise, 4), "load_per_core": self.load_per_core,
                "timings_reused": self.timings_reused}


@dataclass(frozen=True)
class LearnedKey:
    """What the saved statistics depend on."""

    target: str
    drafter: DrafterSpec | str  # a spec or its spelling
    fast_head: bool
    n_threads: int | None
    n_ctx: int
    fast_body: bool = True  # the body's kernels set the pass costs too

    @classmethod
    def of(cls, options: LoadOptions) -> LearnedKey:
        return cls(options.target, options.draft, options.fast_head, options.n_threads,
                   options.n_ctx, options.fast_body)

    def digest(self) -> str:
        parts = [_file_identity(self.target), _drafter_identity(self.drafter),
                 f"head={self.fast_head}", f"threads={self.n_threads}", f"ctx={self.n_ctx}",
                 f"body={self.fast_body}"]
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def learned_path(key: LearnedKey, root: Path | None = None) -> Path:
    return (root or cache_dir()) / "controller" / f"{key.digest()}.json"


def saved_path(engine: Engine) -> Path:
    """Where `localspec run` keeps what the controller learned for this engine's models."""
    return learned_path(LearnedKey.of(engine.options))


def restore_saved(engine: Engine) -> SavedStats | None:
    """Start the engine's controller from what earlier runs saved; what was, if anything."""
    loaded = read_learned(saved_path(engine))
    if loaded is None:
        return None
    engine.restore_learned(loaded[0])
    return loaded[1]


def load_learned(path: Path) -> _core.ControllerMemory | None:
    """The saved memory as it will be reused, or None when there is none or it cannot be read."""
    loaded = read_learned(path)
    return None if loaded is None else loaded[0]


def read_learned(path: Path) -> tuple[_core.ControllerMemory, SavedStats] | None:
    """The saved memory (without its costs when the run that saved it had noisy timings) and
    what the file says of itself; None when there is none or it cannot be read."""
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            return None
        memory = _core.ControllerMemory()
        memory.trials = [[float(x) for x in row] for row in data["trials"]]
        memory.hits = [[float(x) for x in row] for row in data["hits"]]
        memory.verify = [float(x) for x in data["verify"]]
        memory.draft_cost = [float(x) for x in data["draft_cost"]]
        memory.evidence_trials = [float(x) for x in data["evidence_trials"]]
        memory.evidence_hits = [float(x) for x in data["evidence_hits"]]
        noise = float(data["timing_noise"])
        load = data.get("load_per_core")
        saved = SavedStats(float(data["saved_at"]), noise,
                           None if load is None else float(load),
                           timings_reused=math.isfinite(noise) and noise <= NOISY_TIMINGS)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if saved.timings_reused:
        memory.timing_noise = noise
    else:  # the engine times its passes afresh (calibration) and learns its own noise
        memory.verify = [0.0] * len(memory.verify)
        memory.draft_cost = [0.0] * len(memory.draft_cost)
    return memory, saved


def load_per_core() -> float | None:
    """The 1-minute load average per core this process may use (None where unknown)."""
    try:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return round(os.getloadavg()[0] / max(1, cores or 1), 3)
    except OSError:
        return None


def save_learned(path: Path, memory: _core.ControllerMemory) -> None:
    """Write atomically (a crash leaves the old file or the new one, never half of one), with the
    date, the timing noise and the load."""
    data: dict[str, Any] = {"format": FORMAT, "saved_at": time.time(),
                            "timing_noise": memory.timing_noise, "load_per_core": load_per_core(),
                            "trials": memory.trials, "hits": memory.hits,
                            "verify": memory.verify, "draft_cost": memory.draft_cost,
                            "evidence_trials": memory.evidence_trials,
                            "evidence_hits": memory.evidence_hits}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs the next run its head start


def _file_identity(path: str) -> str:
    try:
        stat = os.stat(path)
    except OSError:
        return path
    return f"{os.path.abspath(path)}:{stat.st_size}:{int(stat.st_mtime)}"


def _drafter_identity(drafter: DrafterSpec | str) -> str:
    """"ngram"/"none" as they are; a draft model (or "hybrid:PATH") by its file's identity."""
    return str(DrafterSpec.parse(drafter).with_path(_file_identity))
