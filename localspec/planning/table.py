"""Rendering a memory ``Plan``: the table of ``localspec plan`` and a one-line summary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from localspec.planning.units import format_bytes

if TYPE_CHECKING:
    from localspec.planning.planner import Placement, Plan

def render_plan(plan: Plan) -> str:
    """The plan as an aligned table, then the verdict, the reason and any warnings."""
    gpu = plan.device.kind == "gpu"
    rows: list[tuple[str, Any]] = [
        ("model", lambda p: p.name),
        ("GGUF file size", lambda p: format_bytes(p.file_bytes)),
        ("layers on device", lambda p: f"{p.layers_on_device}/{p.n_layer}"
         + (" + output" if p.output_on_device else "")),
        ("n_gpu_layers", lambda p: str(p.n_gpu_layers)),
        ("context (tokens)",
         lambda p: str(p.n_ctx) + (f" x {p.n_seq} seqs" if p.n_seq > 1 else "")),
        ("weights on device", lambda p: format_bytes(p.weights_device)),
        (f"KV cache ({plan.kv_type}) on device", lambda p: format_bytes(p.kv_device)),
        ("compute buffers", lambda p: format_bytes(p.compute)),
        ("output head copy", lambda p: format_bytes(p.head_copy_device + p.head_copy_host)),
        ("total on device", lambda p: format_bytes(p.device_bytes)),
    ]
    if gpu:
        rows += [("weights in host RAM", lambda p: format_bytes(p.weights_host)),
                 ("KV cache in host RAM", lambda p: format_bytes(p.kv_host))]
    second = "draft"
    if plan.draft is not None and (plan.draft.is_head or plan.draft.is_mtp):
        second = "EAGLE-3 head" if plan.draft.is_head else "MTP layers"
    cols = [("", "target", second)] + [
        (label, cell(plan.target), cell(plan.draft) if plan.draft else "-")
        for label, cell in rows
    ]
    widths = [max(len(row[i]) for row in cols) for i in range(3)]
    kind = "GPU memory" if gpu else "RAM"
    lines = [f"Device: {plan.device.name} ({kind}), budget {format_bytes(plan.device.free_bytes)}, "
             f"{format_bytes(plan.reserve_bytes)} kept free"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in cols]
    total = plan.device_bytes + plan.reserve_bytes
    verdict = "fits" if plan.fits else "does NOT fit"
    lines.append(f"Total: {format_bytes(total)} of {format_bytes(plan.device.free_bytes)} "
                 f"(reserve included): {verdict}.")
    lines += remote_lines(plan)
    if plan.reason:
        lines.append(plan.reason)
    lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)



def _layers(p: Placement) -> str:
    if p.layers_on_device >= p.n_layer and p.output_on_device:
        return "all layers"
    return f"{p.layers_on_device}/{p.n_layer} layers"


def plan_summary(plan: Plan) -> str:
    """One line for a status bar, e.g. ``CPU RAM: 1.63 GiB of 22.87 GiB (target 832.2 MiB,
    draft 832.2 MiB)`` or ``GPU CUDA0: target 20/28 layers, draft all layers, 7.10 GiB of
    8.00 GiB``; ``does NOT fit`` is appended when the plan refuses."""
    budget = format_bytes(plan.device.free_bytes)
    used = format_bytes(plan.device_bytes)  # the reserve excluded
    parts = [f"target {format_bytes(plan.target.device_bytes)}"]
    if plan.device.kind == "gpu":
        parts = [f"target {_layers(plan.target)}"]
        if plan.draft is not None:
            parts.append(f"draft {_layers(plan.draft)}")
        text = f"GPU {plan.device.name}: {', '.join(parts)}, {used} of {budget}"
        if plan.host_bytes:
            text += f" (+ {format_bytes(plan.host_bytes)} host RAM)"
    else:
        if plan.draft is not None:
            parts.append(f"draft {format_bytes(plan.draft.device_bytes)}")
        text = f"CPU RAM: {used} of {budget} ({', '.join(parts)})"
    if plan.remote:
        moved = sum(p.n_layers for p in plan.remote)
        text += f", {moved} target layers on {len(plan.remote)} remote devices"
    return text if plan.fits else f"{text}: does NOT fit"


def remote_lines(plan: Plan) -> list[str]:
    """The remote devices' rows of ``localspec plan``."""
    if not plan.remote:
        return []
    lines = ["Remote devices (--rpc), target layers first, then the local device:"]
    for p in plan.remote:
        verdict = "fits" if p.fits else "does NOT fit"
        lines.append(f"  {p.device.name} at {p.device.endpoint}: "
                     f"{format_bytes(p.device.free_bytes)} free; {p.layers} "
                     f"({format_bytes(p.weights_bytes)} weights + {format_bytes(p.kv_bytes)} "
                     f"KV cache, {format_bytes(p.reserve_bytes)} kept free): {verdict}")
    lines.append("  local: the input embeddings, the output layer and the drafter"
                 + (f", {plan.target.layers_on_device} layers" if plan.target.layers_on_device
                    else ""))
    return lines
