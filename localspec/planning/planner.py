"""One memory budget for two models (docs/design.md, "Memory plan"): where the draft and target
layers go.

``plan_pair`` is pure: two ``ModelMemory`` (from the GGUF headers), contexts, KV cache type and
a ``Device`` in, a ``Plan`` out. The draft goes on the device first and whole (it runs k times
per step); then as many target layers as fit, from the last one, as llama.cpp offloads them;
KV caches live with their layers; compute buffers and a reserve are set aside. On a CPU it all
sits in RAM and fits or not. ``Placement.n_gpu_layers`` is llama.cpp's ``n_gpu_layers``
(``n_layer + 1`` also offloads the output head).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from localspec.errors import InvalidParameterError
from localspec.planning.devices import Device as Device  # re-exported with the device queries
from localspec.planning.devices import choose_device as choose_device
from localspec.planning.devices import default_device as default_device
from localspec.planning.devices import system_memory_available
from localspec.planning.memory import DEFAULT_UBATCH, HEAD_UBATCH
from localspec.planning.memory import KV_TYPES as KV_TYPES  # re-exported with the model's needs
from localspec.planning.memory import ModelMemory as ModelMemory
from localspec.planning.memory import model_memory as model_memory
from localspec.planning.table import render_plan
from localspec.planning.units import GiB as GiB  # re-exported, as are the two size helpers
from localspec.planning.units import MiB as MiB
from localspec.planning.units import format_bytes as format_bytes
from localspec.planning.units import parse_size as parse_size

if TYPE_CHECKING:
    from localspec.planning.remote import RemotePlacement

@dataclass(frozen=True)
class Placement:
    """Where one model's weights and KV cache go, and the n_gpu_layers that achieves it."""

    name: str
    path: str | None
    n_layer: int
    layers_on_device: int
    output_on_device: bool
    n_gpu_layers: int
    n_ctx: int
    weights_device: int
    weights_host: int
    kv_device: int
    kv_host: int
    compute: int
    file_bytes: int = 0
    head_copy_device: int = 0  # localspec's output head copy (ModelMemory.head_copy_bytes)
    head_copy_host: int = 0
    is_head: bool = False  # an EAGLE-3 head rather than a draft model
    n_seq: int = 1  # sequences with n_ctx cells each in the KV cache (batched serving)
    is_mtp: bool = False  # the target's MTP layers

    @property
    def device_bytes(self) -> int:
        return self.weights_device + self.kv_device + self.compute + self.head_copy_device

    @property
    def host_bytes(self) -> int:
        return self.weights_host + self.kv_host + self.head_copy_host


@dataclass(frozen=True)
class Plan:
    """The answer of the planner; ``explain()`` renders it as a table, ``to_dict()`` as JSON."""

    device: Device
    kv_type: str
    target: Placement
    draft: Placement | None
    reserve_bytes: int
    fits: bool
    reason: str | None = None
    warnings: tuple[str, ...] = field(default_factory=tuple)
    remote: tuple[RemotePlacement, ...] = ()  # target layers on RPC workers (remote_plan)

    @property
    def device_bytes(self) -> int:
        """Everything the plan puts on the device, the reserve excluded."""
        return self.target.device_bytes + (self.draft.device_bytes if self.draft else 0)

    @property
    def host_bytes(self) -> int:
        return self.target.host_bytes + (self.draft.host_bytes if self.draft else 0)

    def explain(self) -> str:
        """The plan as an aligned text table, followed by the verdict and any warnings."""
        return render_plan(self)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: every field, plus the device/host totals of each placement."""
        out = asdict(self)
        for role in ("target", "draft"):
            placement = getattr(self, role)
            if placement is not None:
                out[role].update(device_bytes=placement.device_bytes,
                                 host_bytes=placement.host_bytes)
        out.update(device_bytes=self.device_bytes, host_bytes=self.host_bytes)
        return out


def place_model(model: ModelMemory, n_ctx: int, kv_type: str, on_device: int, *,
                cpu: bool = False, n_ubatch: int = DEFAULT_UBATCH, n_seq: int = 1) -> Placement:
    """Placement with the last ``on_device`` layers (n_layer + 1: and the output) on device.

    On a CPU everything counts as "on the device" (RAM) and the tied head is not duplicated.
    A model whose head stays in host memory also gets localspec's output head copy. The KV
    cache holds ``n_seq`` sequences of ``n_ctx`` cells (one cache shared by batched serving).
    """
    n = model.n_layer
    cells = n_ctx * n_seq
    kv_all = model.kv_bytes(range(n), cells, kv_type) + model.state_bytes(range(n), n_seq)
    head_copy = model.head_copy_bytes
    if cpu:
        return Placement(model.name, model.path, n, n, True, 0, n_ctx, model.file_weight_bytes, 0,
                         kv_all, 0, model.compute_bytes(True, n_ubatch), model.file_bytes,
                         head_copy_device=head_copy, is_head=model.is_head, n_seq=n_seq,
                         is_mtp=model.is_mtp)
    k = min(on_device, n)
    output_dev = on_device > n
    output_once = model.output_bytes - model.tied_bytes
    weights_dev = sum(model.layer_bytes[n - k :]) + (model.output_bytes if output_dev else 0)
    weights_host = sum(model.layer_bytes[: n - k]) + model.input_bytes + (
        0 if output_dev else output_once
    )
    on_dev = range(n - k, n)
    kv_dev = model.kv_bytes(on_dev, cells, kv_type) + model.state_bytes(on_dev, n_seq)
    compute = model.compute_bytes(output_dev, n_ubatch)
    return Placement(model.name, model.path, n, k, output_dev, on_device, n_ctx, weights_dev,
                     weights_host, kv_dev, kv_all - kv_dev, compute, model.file_bytes,
                     head_copy_host=0 if output_dev else head_copy, is_head=model.is_head,
                     n_seq=n_seq, is_mtp=model.is_mtp)


def _best_target(target: ModelMemory, n_ctx: int, kv_type: str, room: int,
                 n_ubatch: int, n_seq: int = 1) -> Placement:
    """The target placement with the most layers on device that still fits in ``room``."""
    full = place_model(target, n_ctx, kv_type, target.n_layer + 1, n_ubatch=n_ubatch, n_seq=n_seq)
    if full.device_bytes <= room:
        return full
    lo, hi = 0, target.n_layer  # largest k with device_bytes(k) <= room (monotone in k)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        placed = place_model(target, n_ctx, kv_type, mid, n_ubatch=n_ubatch, n_seq=n_seq)
        if placed.device_bytes <= room:
            lo = mid
        else:
            hi = mid - 1
    return place_model(target, n_ctx, kv_type, lo, n_ubatch=n_ubatch, n_seq=n_seq)


def _context_warnings(models: list[tuple[str, ModelMemory, int]]) -> list[str]:
    # Sliding-window layers need no warning: speculation rolls the cache back, so the engine
    # keeps full-size caches for them (swa_full), which is exactly what is counted here.
    return [f"the {role} was trained on {m.n_ctx_train} tokens of context; {n_ctx} may degrade "
            "its output" for role, m, n_ctx in models if 0 < m.n_ctx_train < n_ctx]


def default_reserve(device: Device) -> int:
    """Memory left untouched for the runtime/driver: 5% of the budget, at least 256/128 MiB."""
    floor = 256 * MiB if device.kind == "gpu" else 128 * MiB
    return max(floor, device.free_bytes // 20)


def _check_params(kv_type: str, n_ctx: int, draft_n_ctx: int | None) -> str:
    kv_type = kv_type.lower()
    if kv_type not in KV_TYPES:
        raise InvalidParameterError(
            f"kv_type={kv_type!r} is invalid: use one of {', '.join(KV_TYPES)}."
        )
    for name, value in (("n_ctx", n_ctx), ("draft_n_ctx", draft_n_ctx)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise InvalidParameterError(f"{name}={value!r} is invalid: it must be an integer >= 1.")
    return kv_type


def _refusal(device: Device, room: int, reserve: int, draft_need: int) -> str | None:
    """The one-sentence reason when not even the reserve and the whole draft fit, else None."""
    where = "RAM" if device.kind == "cpu" else f"{device.name} memory"
    if room <= 0:
        return (f"The budget of {format_bytes(device.free_bytes)} is smaller than the "
                f"{format_bytes(reserve)} kept free for the runtime: raise --budget or free "
                f"some {where}.")
    if draft_need > room:
        return (f"The draft model alone needs {format_bytes(draft_need)} but only "
                f"{format_bytes(room)} of {where} is usable: pick a smaller draft, use "
                "--draft ngram, or shorten the context with --ctx.")
    return None


def plan_pair(
    target: ModelMemory,
    draft: ModelMemory | None,
    device: Device,
    n_ctx: int,
    kv_type: str = "f16",
    *,
    draft_n_ctx: int | None = None,
    reserve_bytes: int | None = None,
    n_ubatch: int = DEFAULT_UBATCH,
    host_free_bytes: int | None = None,
    n_seq: int = 1,
) -> Plan:
    """Decide where both models go (pure: no I/O). ``draft=None`` for n-gram / no drafter.
    ``n_seq``: sequences sharing the target's KV cache (batched serving), n_ctx cells each."""
    kv_type = _check_params(kv_type, n_ctx, draft_n_ctx)
    d_ctx = draft_n_ctx or n_ctx
    reserve = default_reserve(device) if reserve_bytes is None else reserve_bytes
    cpu = device.kind == "cpu"
    room = device.free_bytes - reserve
    warnings = _context_warnings([("target", target, n_ctx)]
                                 + ([("draft", draft, d_ctx)] if draft else []))

    def plan(t: Placement, d: Placement | None, fits: bool, reason: str | None = None) -> Plan:
        return Plan(device, kv_type, t, d, reserve, fits, reason, tuple(warnings))

    t_full = place_model(target, n_ctx, kv_type, target.n_layer + 1, cpu=cpu, n_ubatch=n_ubatch,
                         n_seq=n_seq)
    d_ubatch = HEAD_UBATCH if draft and (draft.is_head or draft.is_mtp) else n_ubatch
    # A draft model keeps a cache per generation; a head or MTP layers a context per
    # generation (a compute buffer each, too).
    d_place = (place_model(draft, d_ctx, kv_type, draft.n_layer + 1, cpu=cpu, n_ubatch=d_ubatch,
                           n_seq=n_seq) if draft else None)
    if d_place is not None and draft is not None and (draft.is_head or draft.is_mtp):
        d_place = replace(d_place, compute=d_place.compute * n_seq)
    d_need = d_place.device_bytes if d_place else 0
    reason = _refusal(device, room, reserve, d_need)
    if reason is None and cpu and t_full.device_bytes + d_need > room:
        who = "Target and draft need" if draft else "The target needs"
        reason = (f"{who} {format_bytes(t_full.device_bytes + d_need)} of RAM but only "
                  f"{format_bytes(room)} is usable: pick smaller quantizations or shorten the "
                  "context with --ctx.")
    if reason is not None or cpu:
        return plan(t_full, d_place, reason is None, reason)
    t_place = _best_target(target, n_ctx, kv_type, room - d_need, n_ubatch, n_seq)
    if t_place.layers_on_device == 0 and d_place is None:
        return plan(t_place, None, False,
                    f"Not even one target layer fits in {format_bytes(room)} of usable "
                    f"{device.name} memory: free device memory, or run on the CPU with "
                    "--n-gpu-layers 0.")
    if t_place.layers_on_device < target.n_layer:
        warnings.append(f"only {t_place.layers_on_device} of {target.n_layer} target layers fit "
                        "on the device; the rest run on the CPU, which is slower")
    elif not t_place.output_on_device:
        warnings.append("the target's output head does not fit on the device and runs on the "
                        "CPU, which is slower")
    host = t_place.host_bytes + (d_place.host_bytes if d_place else 0)
    if host_free_bytes is not None and host > host_free_bytes:
        warnings.append("the layers left in host memory exceed the available RAM; expect swapping")
    return plan(t_place, d_place, True)


def plan_from_files(
    target_path: str | os.PathLike[str],
    draft_path: str | os.PathLike[str] | None,
    n_ctx: int,
    budget_bytes: int | None = None,
    kv_type: str = "f16",
    *,
    device: Device | None = None,
    draft_n_ctx: int | None = None,
    fast_head: bool = True,
    n_seq: int = 1,
    mtp: bool = False,
    snapshots: bool = True,
    widened: tuple[str, ...] = (),
    draft_widened: tuple[str, ...] = (),
) -> Plan:
    """Plan a pair straight from GGUF files. ``device=None``: the CPU with ``budget_bytes``
    (default: available RAM); with a device, ``budget_bytes`` caps its free memory. ``mtp``:
    the target's MTP layers draft (their context is the second column). ``snapshots``: a
    recurrent target keeps its state's snapshots (the core does whenever something drafts,
    outside exact mode). ``widened``: the target's body matrix types localspec's kernels hold as
    int8 (model_memory.widened_types); ``draft_widened``: the draft model's (default mode's rule
    in both modes; none for an EAGLE-3 head)."""
    if device is None:
        device = default_device(budget_bytes)
    elif budget_bytes is not None:
        device = Device(device.name, budget_bytes, device.kind)
    target = model_memory(target_path, fast_head=fast_head, widened=widened)
    draft = (model_memory(draft_path, fast_head=fast_head, widened=draft_widened)
             if draft_path is not None else None)
    if mtp and target.n_layer_nextn:
        draft = target.mtp_memory()
    target = target.without_nextn_kv()
    if not snapshots:
        target = replace(target, state_copies=1)
    host = system_memory_available() if device.kind == "gpu" else None
    return plan_pair(target, draft, device, n_ctx, kv_type, draft_n_ctx=draft_n_ctx,
                     host_free_bytes=host, n_seq=n_seq)
