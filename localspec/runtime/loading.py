"""Opening the C++ core: argument checks with clear errors, then the model load."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from localspec import _core
from localspec.bench.invariance import differing_row_counts
from localspec.drafter_spec import AUTO, MTP, NGRAM, NO_DRAFTER, DrafterSpec
from localspec.errors import InvalidParameterError, ModelLoadError
from localspec.models.gguf_reader import read_gguf
from localspec.planning.devices import ggml_devices, offload_device
from localspec.planning.planner import KV_TYPES
from localspec.runtime.rpc import endpoints_violation, require_rpc
from localspec.types import EngineInfo

# Architectures of draft heads: they borrow the target's embeddings and cannot run alone.
HEAD_ARCHITECTURES = ("eagle3",)


def canonical_drafter(drafter: DrafterSpec) -> DrafterSpec:
    """The drafter the engine reports: n-gram lookup chained with an EAGLE-3 head is
    "eagle3:PATH" whether it was asked for so or as "hybrid:PATH"; a bare head path is the head
    alone, as a bare draft model path is that model alone."""
    kind, path = core_drafter(drafter)
    return DrafterSpec("eagle3", path) if kind == "eagle3" else drafter


def core_drafter(drafter: DrafterSpec) -> tuple[str, str]:
    """(kind, path) of EngineOptions: the one place a drafter's spelling becomes what the core
    runs. A model path is a draft model or, when the file is an EAGLE-3 head, that head:
    "model" / "head" alone, "hybrid" / "eagle3" after n-gram lookup (hybrid:HEAD is eagle3)."""
    path = drafter.path or ""
    if drafter.kind in ("model", "hybrid", "eagle3") and is_head(path):
        return ("head" if drafter.kind == "model" else "eagle3"), path
    return drafter.kind, path


def is_head(path: str) -> bool:
    """Whether the GGUF at `path` is a draft head (it drafts from the target's hidden states)."""
    return read_gguf(path, read_arrays=False).architecture in HEAD_ARCHITECTURES


DEFAULT_N_CTX = 4096
N_CTX_RANGE = (16, 1 << 22)


@dataclass(frozen=True)
class LoadOptions:
    """How to load a target and its drafter: the one owner of load defaults and their checks."""

    target: str
    draft: DrafterSpec = AUTO
    n_ctx: int = DEFAULT_N_CTX
    # CPU threads; None: decided at load by threads.default_threads (the usable cores minus
    # those other work keeps busy), after which Engine.options holds the count (with_threads).
    n_threads: int | None = None
    n_gpu_layers: int = -1  # target layers to offload to a GPU (-1: all)
    n_gpu_layers_draft: int | None = None  # None: same as n_gpu_layers
    draft_sampling: bool = True  # a draft model samples from q at temperature > 0
    draft_p_min: float = 0.4  # a draft model stops drafting below this top probability
    # A draft model drafts among the first draft_vocab token ids alone (BPE ids come in merge
    # order, the most frequent first; FR-Spec): its head computes that many rows. 0: all.
    # Needs localspec's head for the draft model (fast_head, a Q8_0 or Q6_K head).
    draft_vocab: int = 0
    # Logits from localspec's own Q8_0 or Q6_K head on the CPU (csrc/kernels/q8_head.h, q6k_head.h)
    # when the model's head allows it; False: always llama.cpp's.
    fast_head: bool = True
    # The target's body matrices of the types localspec's int8 kernels multiply faster
    # (_core.faster_body_types(): Q8_0, Q5_0, Q4_K, Q6_K; csrc/kernels/body_matmul.h) where this
    # CPU runs them and ``repack`` holds; False: llama.cpp's (exact mode always uses
    # localspec's, for every quantized matrix).
    fast_body: bool = True
    kv_type: str = "f16"  # the KV cache type of both models (planner.KV_TYPES)
    # llama.cpp's repacked CPU weight layouts for the target (llama.cpp's --no-repack turns
    # them off): faster on CPUs, and what ggml's RPC workers never use (docs/rpc.md).
    repack: bool = True
    # Exact mode (docs/exact.md): batch-invariant target passes, so speculative output equals
    # plain output bit for bit. A load-time choice (the weights' layout, the context's kernels).
    exact: bool = False
    # Generations that run together, sharing each target pass (batched serving; the server's
    # --parallel). In exact mode they take turns.
    parallel: int = 1
    # RPC workers (HOST:PORT) lending devices for the target's layers (docs/rpc.md): remote
    # devices first, then local GPUs; the drafter and the output layer stay local.
    rpc: tuple[str, ...] = ()
    # Tokens of recent outputs (across requests) the n-gram drafter also looks up, where they
    # match longer than the request's own context (csrc/draft/recent_outputs.h); 0: off.
    recent_ngram_tokens: int = 0
    verbose: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.draft, DrafterSpec):  # a spelling such as "ngram" or a path
            object.__setattr__(self, "draft", DrafterSpec.parse(self.draft))

    def with_threads(self) -> LoadOptions:
        """These options with the thread count decided: the given one, else the default for
        this machine as loaded now."""
        if self.n_threads is not None:
            return self
        from localspec.runtime.threads import default_threads

        return replace(self, n_threads=default_threads())

    def validate(self) -> None:
        """Raise InvalidParameterError with one sentence naming the bad value (files are
        checked when loading)."""
        for name in _LOAD_RULES:
            rule = load_rule_violation(name, getattr(self, name))
            if rule is not None:
                raise InvalidParameterError(f"{name}={getattr(self, name)!r} is invalid: {rule}.")
        rule = endpoints_violation(self.rpc)
        if rule is not None:
            raise InvalidParameterError(f"rpc={self.rpc!r} is invalid: {rule}.")
        if self.rpc and self.exact and self.kv_type in EXACT_RPC_UNSAFE_KV:
            raise InvalidParameterError(
                f"exact mode over RPC workers needs a quantized KV cache, not {self.kv_type}: "
                "a worker's attention over an F16/F32 cache sums many rows and long contexts in "
                "other orders than one row; add --kv-type q8_0."
            )


MAX_PARALLEL = 64  # LoadOptions.parallel
MAX_RECENT_NGRAM_TOKENS = 1 << 20  # LoadOptions.recent_ngram_tokens
# Cache types whose flash attention on a CPU worker takes ggml's tiled (many rows) or split
# (one row, 512+ cells) paths, which ggml's reference kernels turn off locally but an RPC worker
# cannot be asked to (docs/exact.md, "Over RPC workers").
EXACT_RPC_UNSAFE_KV = frozenset({"f16", "f32"})

_LOAD_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n_ctx": (lambda v: isinstance(v, int) and N_CTX_RANGE[0] <= v <= N_CTX_RANGE[1],
              "use 16 to 4194304 tokens"),
    "draft_p_min": (lambda v: isinstance(v, (int, float)) and 0.0 <= v < 1.0, "use [0, 1)"),
    "draft_vocab": (lambda v: isinstance(v, int) and not isinstance(v, bool)
                    and (v == 0 or 256 <= v <= 1 << 24),
                    "use 0 (the whole vocabulary) or 256 to 16777216 token ids"),
    "n_threads": (lambda v: v is None or (isinstance(v, int) and v >= 1), "use 1 or more"),
    "recent_ngram_tokens": (lambda v: isinstance(v, int) and not isinstance(v, bool)
                            and 0 <= v <= MAX_RECENT_NGRAM_TOKENS,
                            "use 0 (off) to 1048576 tokens"),
    "kv_type": (lambda v: v in KV_TYPES, "use one of " + ", ".join(sorted(KV_TYPES))),
    "parallel": (lambda v: isinstance(v, int) and 1 <= v <= MAX_PARALLEL,
                 f"use 1 to {MAX_PARALLEL}"),
}


def load_rule_violation(name: str, value: object) -> str | None:
    """The rule ``value`` breaks as LoadOptions' field ``name``, or None when it is valid."""
    check, rule = _LOAD_RULES[name]
    return None if check(value) else rule


def check_model_path(path: str, role: str) -> None:
    """Catch missing, non-GGUF and truncated files and draft heads given as models with a
    precise sentence before llama.cpp (which would abort on a head)."""
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"The {role} model '{path}' does not exist; check the path.")
    if p.is_dir():
        raise ModelLoadError(f"The {role} model '{path}' is a directory; pass a .gguf file.")
    if not os.access(p, os.R_OK):
        raise ModelLoadError(f"The {role} model '{path}' is not readable; check its permissions.")
    architecture = read_gguf(p, read_arrays=False).architecture
    if architecture in HEAD_ARCHITECTURES and role == "target":
        raise ModelLoadError(
            f"'{path}' is an {architecture} draft head, not a model that generates text on its "
            f"own; give its target model as the {role} model."
        )


def check_draft_memory(options: LoadOptions) -> None:
    """Refuse a draft model whose memory cannot take back rejected draft tokens (a recurrent or
    hybrid model: it drafts one token per pass, and its state snapshots reach back one pass
    only) before anything loads."""
    draft = options.draft.path
    if draft is None or is_head(draft):
        return
    memory = _core.memory_kind(draft)
    if memory != "attention":
        raise ModelLoadError(
            f"The draft model '{draft}' is a {memory} model, whose memory cannot take back its "
            "rejected draft tokens; use a transformer draft model or --draft ngram."
        )


def speculation_drafter(core: _core.Core, options: LoadOptions) -> tuple[DrafterSpec, str]:
    """(the drafter in effect, a notice for the user) once the target's memory is known.

    Speculation rolls rejected draft tokens back out of the target's cache. A recurrent or
    hybrid model keeps one running state; llama.cpp takes it back through snapshots for the
    architectures that keep them (LFM2, Qwen3.5, ...: ``core.rollback_depth()`` > 0, and the
    core caps drafts there). Without snapshots the n-gram drafter, the default, is switched
    off (the engine decodes plainly) with a notice; another drafter is refused."""
    memory = core.memory_kind()
    if memory == "attention" or options.draft == NO_DRAFTER or core.rollback_depth() > 0:
        return options.draft, ""
    what = (
        f"'{options.target}' is a {memory} model whose memory cannot take back rejected "
        "draft tokens (llama.cpp keeps no snapshots of its state)"
    )
    if options.draft == NGRAM:
        return NO_DRAFTER, f"speculation is off: {what}; decoding plainly."
    raise ModelLoadError(f"The target {what}, so it cannot verify a draft model; use --draft none.")


def drafts_with_mtp(drafter: DrafterSpec, target: str, *, exact: bool = False) -> bool:
    """Whether the target's MTP layers draft: asked for ("mtp"), or "auto" on a target that
    carries layers the core can run (not in exact mode, which measures)."""
    if drafter.kind == "auto":
        if exact or not read_gguf(target, read_arrays=False).arch_get("nextn_predict_layers"):
            return False  # (reading the header first also reports a broken file precisely)
        return _core.mtp_unsupported(target) == ""
    return drafter.kind == "mtp"


def resolved_drafter(drafter: DrafterSpec, target: str, *, exact: bool = False) -> DrafterSpec:
    """The drafter "auto" in effect: the target's MTP layers chained with n-gram lookup ("mtp")
    where they can draft, else n-gram lookup; any other drafter as it is."""
    if drafter != AUTO:
        return drafter
    return MTP if drafts_with_mtp(drafter, target, exact=exact) else NGRAM


def resolve_auto(options: LoadOptions) -> LoadOptions:
    return replace(options, draft=resolved_drafter(options.draft, options.target,
                                                   exact=options.exact))


def check_exact_backend(options: LoadOptions, devices: list[dict[str, Any]]) -> None:
    """Exact mode's promise holds on the CPU backend only: on CUDA every weight type's passes
    of 2 or more rows give other logits bits than single-token passes, in exact mode too
    (docs/gpu.md), so speculative output can leave plain output there."""
    gpu = offload_device(devices) if options.exact and options.n_gpu_layers != 0 else None
    if gpu is not None:
        name = gpu.get("description") or gpu.get("name") or "a GPU"
        raise InvalidParameterError(
            f"exact mode is bit-identical on the CPU backend only, and this build would run the "
            f"target's layers on {name}; add --n-gpu-layers 0 to keep them on the CPU, or leave "
            "out --exact."
        )


REMOTE_CHECK_ROWS = 8  # ggml's last kernel switch by rows (the tiled K-quant matmul) is at 8
_CHECK_TEXT = "The quick brown fox jumps over the lazy dog, then runs home to sleep. " * 3


def check_remote_rows(core: _core.Core) -> None:
    """Exact mode over RPC workers: a worker computes with its own process's kernels
    (``localspec rpc-worker --exact`` turns ggml's tiled matmul off there), which this side
    cannot set, so the load measures them: passes of 1..8 rows against single-token passes."""
    tokens = core.tokenize(_CHECK_TEXT, True, False)[: 2 * REMOTE_CHECK_ROWS]
    differing = differing_row_counts(core, tokens, max_rows=REMOTE_CHECK_ROWS)
    if differing:
        raise InvalidParameterError(
            f"exact mode measured passes of {', '.join(map(str, differing))} rows giving other "
            "bits than single-token passes on the RPC workers; start each worker with "
            "`localspec rpc-worker --exact`, or leave out --exact."
        )


def _check_options(options: LoadOptions) -> None:
    options.validate()
    if options.exact:  # asks ggml for its devices only when it matters
        check_exact_backend(options, ggml_devices())
    check_model_path(options.target, "target")
    draft = options.draft.path
    if draft is not None:
        check_model_path(draft, "draft")
        if options.draft.kind == "eagle3" and not is_head(draft):
            raise ModelLoadError(
                f"'{draft}' is not an EAGLE-3 head; give an eagle3 GGUF after 'eagle3:', or the "
                "path alone for a draft model."
            )


# The core's options that LoadOptions does not have: fixed by the core (its drafters' match
# lengths, the controller's longest draft) or knobs only measurements turn (flash_attn).
# Every other field of _core.EngineOptions is LoadOptions', set by ``engine_options``: the C++
# initializers of those are placeholders for C++ callers, never a second default.
CORE_OWNED_OPTIONS = frozenset({"ngram_min", "ngram_max", "controller_k_max", "flash_attn"})


def engine_options(options: LoadOptions) -> _core.EngineOptions:
    """The core's options for ``options`` (validated and resolved): every field LoadOptions
    owns is set here."""
    core_options = _core.EngineOptions()
    core_options.target_path = options.target
    core_options.drafter_kind, core_options.drafter_path = core_drafter(options.draft)
    core_options.n_ctx = options.n_ctx
    core_options.n_threads = options.n_threads or 0
    core_options.n_gpu_layers_target = options.n_gpu_layers
    core_options.rpc = list(options.rpc)
    core_options.n_gpu_layers_draft = (
        options.n_gpu_layers if options.n_gpu_layers_draft is None else options.n_gpu_layers_draft
    )
    core_options.draft_sampling = options.draft_sampling
    core_options.draft_p_min = options.draft_p_min
    core_options.draft_vocab = options.draft_vocab
    core_options.fast_head = options.fast_head
    core_options.fast_body = options.fast_body
    core_options.kv_type = options.kv_type
    core_options.repack = options.repack
    core_options.exact = options.exact
    core_options.verbose = options.verbose
    core_options.recent_ngram_tokens = options.recent_ngram_tokens
    # Every drafter serves `parallel` generations (a draft model keeps a cache per generation,
    # a head or MTP layers a context per generation); in exact mode they take turns.
    core_options.n_seq = options.parallel
    return core_options


def open_core(options: LoadOptions) -> tuple[_core.Core, EngineInfo]:
    """Load the target and drafter. Raises a LocalspecError for every user mistake."""
    _check_options(options)
    options = resolve_auto(options)
    if options.rpc:
        require_rpc()
    check_draft_memory(options)
    core_options = engine_options(options)
    core = _core.Core(core_options)
    try:
        if options.exact and options.rpc:
            check_remote_rows(core)
        drafter, notice = speculation_drafter(core, options)
    except (ModelLoadError, InvalidParameterError):
        core.close()
        raise
    return core, _engine_info(core, replace(options, draft=canonical_drafter(drafter)), notice)


def _engine_info(core: _core.Core, options: LoadOptions, notice: str) -> EngineInfo:
    name = core.metadata("general.name") or Path(options.target).stem
    template = core.chat_template() or None
    bos, eos = core.bos(), core.eos()
    return EngineInfo(
        target_path=options.target,
        drafter=str(options.draft),
        n_ctx=core.n_ctx(),
        n_vocab=core.n_vocab(),
        target_name=name,
        chat_template=template,
        bos_text=core.token_text(bos) if bos >= 0 else "",
        eos_text=core.token_text(eos) if eos >= 0 else "",
        verify_head=core.verify_head(),
        exact=options.exact,
        draft_head=core.draft_head(),
        memory=core.memory_kind(),
        rollback_depth=core.rollback_depth(),
        notice=notice,
        parallel=core.n_seq(),
        rpc=options.rpc,
    )
