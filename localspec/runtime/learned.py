"""What the draft-length controller learned, saved between runs of `localspec run`.

The engine keeps the controller's memory (acceptance by draft kind and position, pass costs by
row count, draft costs) across the requests of one process; this module writes it to the cache
directory so that the next `localspec run` of the same model + drafter starts from it instead of
from nothing (docs/design.md, "The controller"). The file is keyed by everything that changes
what was learned: the target and draft files (path, size, modification time), the drafter, the
head, the thread count and the context size. A file that cannot be read is ignored (and
replaced on the next save): statistics are a hint, never a reason to fail.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec import _core
from localspec.drafter_spec import DrafterSpec
from localspec.runtime.loading import LoadOptions

if TYPE_CHECKING:
    from localspec.runtime.engine import Engine
from localspec.models.sources import cache_dir

FORMAT = 1


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


def restore_saved(engine: Engine) -> bool:
    """Start the engine's controller from what earlier runs saved; whether anything was."""
    saved = load_learned(saved_path(engine))
    if saved is not None:
        engine.restore_learned(saved)
    return saved is not None


def load_learned(path: Path) -> _core.ControllerMemory | None:
    """The saved memory, or None when there is none or it cannot be read."""
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            return None
        memory = _core.ControllerMemory()
        memory.trials = [[float(x) for x in row] for row in data["trials"]]
        memory.hits = [[float(x) for x in row] for row in data["hits"]]
        memory.verify = [float(x) for x in data["verify"]]
        memory.draft_cost = [float(x) for x in data["draft_cost"]]
        return memory
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_learned(path: Path, memory: _core.ControllerMemory) -> None:
    """Write atomically (a crash leaves the old file or the new one, never half of one)."""
    data: dict[str, Any] = {"format": FORMAT, "trials": memory.trials, "hits": memory.hits,
                            "verify": memory.verify, "draft_cost": memory.draft_cost}
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
