"""`localspec quantize`: make a low-bit copy of a GGUF (e.g. a self-draft) with llama.cpp."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from localspec import _core
from localspec.errors import LocalspecError, ModelLoadError
from localspec.files import check_output_path
from localspec.runtime.loading import check_model_path

TYPES = (
    "Q4_K_M",
    "Q4_K_S",
    "Q5_K_M",
    "Q6_K",
    "Q8_0",
    "Q4_0",
    "Q3_K_M",
    "Q2_K",
    "F16",
    "BF16",
    "F32",
)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "quantize",
        help="quantize a GGUF (re-quantization allowed)",
        description="Write OUT as a copy of IN quantized to --type (llama.cpp quantize API).",
    )
    parser.add_argument("input", help="source GGUF")
    parser.add_argument("output", help="destination GGUF")
    parser.add_argument("--type", required=True, choices=TYPES,
                        help="target quantization (required)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="CPU threads (default: all cores, %(default)s)")
    parser.set_defaults(func=run)


def quantize(
    input_path: str | Path, output_path: str | Path, type_name: str, threads: int = 0
) -> Path:
    check_model_path(str(input_path), "input")
    out = check_output_path(output_path, "output", [input_path])
    try:
        _core.quantize(str(input_path), str(out), type_name, threads)
    except LocalspecError as error:
        # llama.cpp says only "basic_ios::clear: iostream error" when the write fails.
        free = shutil.disk_usage(out.parent).free
        if "iostream" in str(error) or free < Path(input_path).stat().st_size:
            out.unlink(missing_ok=True)
            raise ModelLoadError(
                f"output: could not write '{out}': {free / 2**20:.0f} MiB are free in "
                f"'{out.parent}' and the quantized model may need up to the input's size "
                f"({Path(input_path).stat().st_size / 2**20:.0f} MiB); free space or write "
                "elsewhere.") from None
        raise
    return out


def run(args: argparse.Namespace) -> int:
    out = quantize(args.input, args.output, args.type, args.threads)
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB, {args.type})")
    return 0
