"""Which device the memory planner plans for: ggml's GPUs, else the CPU with its available RAM."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

DeviceKind = Literal["gpu", "cpu"]


@dataclass(frozen=True)
class Device:
    """Where the models go: a GPU's free memory, or the RAM available on a CPU-only machine."""

    name: str
    free_bytes: int
    kind: DeviceKind = "gpu"


def system_memory_available() -> int:
    """RAM available for new allocations: MemAvailable on Linux, else the sysconf estimate."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            found = [int(line.split()[1]) * 1024 for line in meminfo
                     if line.startswith("MemAvailable:")]
        if found:
            return found[0]
    except OSError:
        pass
    for name in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):  # macOS lacks the first
        try:
            return int(os.sysconf(name)) * int(os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError):
            continue
    return 0


DeviceLister = Callable[[], list[dict[str, Any]]]
_OFFLOAD_KINDS = ("gpu", "igpu")  # ggml device kinds that hold model layers


def ggml_devices() -> list[dict[str, Any]]:
    """ggml's backend devices (name, description, kind, free_bytes, total_bytes), or [] when the
    compiled core is not available."""
    try:
        from localspec import _core
    except ImportError:
        return []
    return list(_core.list_devices())


def offload_device(devices: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Pure: the first device of ``devices`` that holds model layers (a GPU or an iGPU: CUDA,
    Metal, ...), or None on a CPU-only build."""
    return next((dev for dev in devices if dev.get("kind") in _OFFLOAD_KINDS), None)


def choose_device(devices: list[dict[str, Any]], budget_bytes: int | None = None) -> Device:
    """Pure: the first GPU/iGPU of ``devices`` with its free memory, else the CPU with the
    available RAM; ``budget_bytes`` replaces the free memory of whichever is chosen."""
    dev = offload_device(devices)
    if dev is not None:
        name = str(dev.get("name") or "GPU")
        description = str(dev.get("description") or "")
        if description and description != name:
            name = f"{name} ({description})"
        free = int(dev.get("free_bytes") or 0) or int(dev.get("total_bytes") or 0)
        return Device(name, budget_bytes if budget_bytes is not None else free, "gpu")
    free = budget_bytes if budget_bytes is not None else system_memory_available()
    return Device(name="CPU", free_bytes=free, kind="cpu")


def default_device(budget_bytes: int | None = None, *,
                   list_devices: DeviceLister | None = None) -> Device:
    """The device to plan for: the first GPU ggml reports, else the CPU (RAM).

    ``list_devices`` replaces ggml's device query (tests pass made-up lists)."""
    return choose_device((list_devices or ggml_devices)(), budget_bytes)
