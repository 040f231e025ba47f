"""The memory plan with RPC workers (docs/rpc.md): which target layers each remote device holds,
and what stays local.

llama.cpp spreads the layers over the devices in the order the core gives them (remote devices
first, then the local GPUs) in proportion to their free memory, counting the output layer as
one more slot after the last layer (llama-model.cpp, load_tensors). The output layer and the
input embeddings stay local, and so does the drafter. ``split_layers`` is that rule, pure.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from localspec.planning.planner import model_memory, place_model
from localspec.planning.units import MiB, format_bytes
from localspec.runtime.rpc import RemoteDevice

if TYPE_CHECKING:
    from localspec.planning.planner import ModelMemory, Plan


@dataclass(frozen=True)
class RemotePlacement:
    """The target layers one remote device holds, with their weights and KV cache."""

    device: RemoteDevice
    first_layer: int
    n_layers: int
    weights_bytes: int
    kv_bytes: int
    reserve_bytes: int

    @property
    def bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes

    @property
    def fits(self) -> bool:
        return self.bytes + self.reserve_bytes <= self.device.free_bytes

    @property
    def layers(self) -> str:
        if self.n_layers == 0:
            return "no layers"
        last = self.first_layer + self.n_layers - 1
        return f"layer {last}" if self.n_layers == 1 else f"layers {self.first_layer}-{last}"


def split_layers(n_layer: int, free_bytes: Sequence[int]) -> list[range]:
    """llama.cpp's default split: the layers each device gets, in device order, in proportion to
    the free memory (the output layer is slot n_layer, not returned)."""
    weights = [max(f, 0) for f in free_bytes]
    if sum(weights) == 0:
        weights = [1] * len(weights)
    total, bounds, running = sum(weights), [], 0
    for weight in weights:
        running += weight
        bounds.append(running / total)
    owner = [sum(1 for b in bounds if b <= il / (n_layer + 1)) for il in range(n_layer)]
    return [range(owner.index(d), owner.index(d) + owner.count(d)) if d in owner else range(0)
            for d in range(len(weights))]


def remote_reserve(device: RemoteDevice) -> int:
    """Memory left untouched on a worker's device: 5% of its free memory, at least 128 MiB."""
    return max(128 * MiB, device.free_bytes // 20)


def with_remote(plan: Plan, target: ModelMemory, remote: Sequence[RemoteDevice]) -> Plan:
    """``plan`` (everything local) with the target's layers spread over ``remote`` first: the
    local device keeps the rest, the output layer and the drafter."""
    gpu = plan.device.kind == "gpu"
    frees = [d.free_bytes for d in remote] + ([plan.device.free_bytes] if gpu else [])
    ranges = split_layers(target.n_layer, frees)
    n_ctx, n_seq = plan.target.n_ctx, plan.target.n_seq
    placements = tuple(
        RemotePlacement(device, r.start, len(r), sum(target.layer_bytes[r.start:r.stop]),
                        target.kv_bytes(r, n_ctx * n_seq, plan.kv_type), remote_reserve(device))
        for device, r in zip(remote, ranges, strict=False)
    )
    full = place_model(target, n_ctx, plan.kv_type, target.n_layer + 1, cpu=not gpu,
                       n_seq=n_seq)
    moved = sum(p.n_layers for p in placements)
    local = replace(
        full,
        layers_on_device=target.n_layer - moved,
        output_on_device=True,
        n_gpu_layers=target.n_layer + 1,
        weights_device=full.weights_device - sum(p.weights_bytes for p in placements),
        kv_device=full.kv_device - sum(p.kv_bytes for p in placements),
    )
    draft = plan.draft.device_bytes if plan.draft else 0
    room = plan.device.free_bytes - plan.reserve_bytes
    reason = plan.reason if plan.reason and not plan.fits and draft > room else None
    crowded = [p for p in placements if not p.fits]
    if reason is None and crowded:
        p = crowded[0]
        reason = (f"The {p.layers} meant for {p.device.name} at {p.device.endpoint} need "
                  f"{format_bytes(p.bytes)} but it has {format_bytes(p.device.free_bytes)} free: "
                  "add a worker, or free memory there.")
    if reason is None and local.device_bytes + draft > room:
        reason = (f"What stays local needs {format_bytes(local.device_bytes + draft)} but only "
                  f"{format_bytes(room)} is usable: add a worker, or shorten the context with "
                  "--ctx.")
    return replace(plan, target=local, remote=placements, fits=reason is None, reason=reason)


def spread(plan: Plan, target_path: str | os.PathLike[str], remote: Sequence[RemoteDevice], *,
           fast_head: bool = True) -> Plan:
    """``with_remote`` for the target at ``target_path`` (its GGUF header is read); ``plan``
    unchanged without remote devices."""
    if not remote:
        return plan
    return with_remote(plan, model_memory(target_path, fast_head=fast_head), remote)
