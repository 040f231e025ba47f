"""Sizes in bytes: the units, a human-readable size, and a size the user typed."""

from __future__ import annotations

import re

from localspec.errors import InvalidParameterError

MiB = 1 << 20
GiB = 1 << 30


def format_bytes(n: int) -> str:
    """Human-readable binary size: "1.50 GiB", "235.8 MiB", "512 B"."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GiB" else f"{n / scale:.1f} {unit}"
    return f"{n} B"


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Parse "8GiB", "512MiB", "6GB", "6G" (binary), "1000000" (bytes) into bytes."""
    match = _SIZE_RE.match(text)
    if not match or (match.group(3) and not match.group(2)):
        raise InvalidParameterError(
            f"budget {text!r} is not a size: write it like 8GiB, 512MiB or 6GB."
        )
    number, unit, binary, byte = match.groups()
    power = " kmgt".index(unit.lower()) if unit else 0
    decimal = bool(byte) and not binary  # "GB" is decimal; "GiB" and bare "G" are binary
    return int(float(number) * ((1000 if decimal else 1024) ** power))
