"""Limits a user asked past, said out loud: a context llama.cpp enlarged, GPU layers on a build
without a GPU backend. Each is one sentence; the commands print them as notes (the chat shows
them in its transcript). Nothing here stops a run."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from localspec.planning.devices import ggml_devices
from localspec.types import EngineInfo

GPU_KINDS = ("gpu", "igpu")


def has_gpu_backend(list_devices: Callable[[], list[dict[str, Any]]] = ggml_devices) -> bool:
    """Whether the llama.cpp build has a device that can hold model layers."""
    return any(device.get("kind") in GPU_KINDS for device in list_devices())


def context_note(requested: int, info: EngineInfo) -> str | None:
    """A sentence when llama.cpp made the context larger than asked (it pads to 256 tokens)."""
    if info.n_ctx <= requested:
        return None
    return (f"the context was raised from {requested} to {info.n_ctx} tokens: llama.cpp sizes "
            "it in steps of 256 tokens.")


def gpu_layers_note(n_gpu_layers: int | None, gpu_backend: bool) -> str | None:
    """A sentence when --n-gpu-layers asks for offloading that this build cannot do."""
    if n_gpu_layers in (None, 0) or gpu_backend:
        return None
    return (f"--n-gpu-layers {n_gpu_layers} has no effect: this llama.cpp build runs on the CPU "
            "only (README, Install variants: CUDA or Metal).")


def limit_notes(args: argparse.Namespace, requested_ctx: int, info: EngineInfo,
                gpu_backend: bool | None = None) -> list[str]:
    """The notes for a loaded engine (``gpu_backend``: None asks ggml)."""
    explicit = getattr(args, "n_gpu_layers", None)
    if gpu_backend is None:  # RPC workers take offloaded layers too
        gpu_backend = explicit in (None, 0) or bool(getattr(args, "rpc", None)) or has_gpu_backend()
    notes = [context_note(requested_ctx, info), gpu_layers_note(explicit, gpu_backend)]
    return [note for note in notes if note is not None]
