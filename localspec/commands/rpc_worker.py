"""`localspec rpc-worker`: lend this machine's devices to another localspec (docs/rpc.md)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from typing import Any

from localspec.errors import InvalidParameterError
from localspec.runtime.rpc import DEFAULT_PORT, is_loopback, require_rpc

# ggml's RPC server allocates every tensor in the device's plain buffers, and its wire format
# carries no repacking, so a CPU device computes without llama.cpp's repacked weight layouts
# (measured in docs/rpc.md).
CPU_LAYOUT_NOTE = (
    "localspec rpc-worker: note: ggml's RPC server keeps the CPU's weights in their file layout, "
    "so layers placed here run as with --no-repack on the client, slower than there on most "
    "quantized models (docs/rpc.md)."
)

# Exact mode's kernels for the layers a client places here (docs/exact.md): ggml's tiled K-quant
# matmul sums passes of 8 or more rows in another order than one row, and it is switched per
# process (the client's own CPU layers use ggml's reference kernels instead, which a worker's
# backend cannot be asked for over RPC). The client checks the rows at load.
EXACT_ENV = {"GGML_CPU_TILED_MM": "0"}
EXACT_NOTE = (
    "localspec rpc-worker: exact mode: ggml's tiled K-quant matmul is off in this process, so "
    "rows computed here are batch-invariant for a client that loads with --exact and "
    "--kv-type q8_0 (docs/exact.md)."
)

INSECURE_BIND = (
    "localspec: warning: {host} is not a loopback address: ggml's RPC protocol has no "
    "authentication and no encryption, so anyone who can reach {host}:{port} can use this "
    "machine's devices and read what runs on them; run it only inside a trusted network or "
    "behind a tunnel (ssh -L, WireGuard)."
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "rpc-worker",
        help="lend this machine's devices to another localspec (llama.cpp RPC)",
        description="Serve this machine's devices over llama.cpp's RPC protocol, so that a "
        "localspec on another machine can place target layers here (--rpc HOST:PORT there). "
        "Serves one client at a time until stopped (Ctrl+C).",
    )
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on; anything but loopback prints a security "
                        "warning (default: %(default)s)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help="TCP port to listen on (default: %(default)s)")
    parser.add_argument("--device", action="append", default=None, metavar="NAME",
                        help="a ggml device to lend, repeatable or comma-separated, e.g. CUDA0 "
                        "(default: every GPU, else the CPU)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for a CPU device (default: all cores)")
    parser.add_argument("--exact", action="store_true",
                        help="compute with batch-invariant kernels, for clients in exact mode "
                        "(CPU devices only; docs/exact.md) (default: off)")
    parser.set_defaults(func=handler)


def _devices(values: list[str] | None) -> list[str]:
    return [name.strip() for value in values or [] for name in value.split(",") if name.strip()]


def check_exact_devices(lent: list[str]) -> None:
    """Exact mode holds on the CPU backend only (docs/gpu.md: GPU rows differ by pass size)."""
    others = [name for name in lent if name != "CPU"]
    if others:
        raise InvalidParameterError(
            f"--exact lends CPU devices only, and this worker would lend {', '.join(others)}; "
            "add --device CPU, or leave out --exact."
        )


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise InvalidParameterError(
                f"cannot listen on {host}:{port} ({error.strerror}); pick another --port or "
                "--host."
            ) from None


def handler(args: argparse.Namespace) -> int:
    from localspec import _core

    if not 1 <= args.port <= 65535:
        raise InvalidParameterError(f"--port {args.port} is invalid: use 1 to 65535.")
    if args.threads is not None and args.threads < 1:
        raise InvalidParameterError(f"--threads {args.threads} is invalid: use 1 or more.")
    require_rpc()
    _check_port_free(args.host, args.port)
    if not is_loopback(args.host):
        print(INSECURE_BIND.format(host=args.host, port=args.port), file=sys.stderr)
    devices = _devices(args.device)
    lent = devices or _core.default_worker_devices()
    if args.exact:
        check_exact_devices(lent)
        os.environ.update(EXACT_ENV)  # read by ggml at its first matmul in this process
    print(f"localspec rpc-worker: lending {', '.join(lent)} at {args.host}:{args.port} "
          "(Ctrl+C stops)", file=sys.stderr, flush=True)
    if "CPU" in lent:
        print(CPU_LAYOUT_NOTE, file=sys.stderr, flush=True)
    if args.exact:
        print(EXACT_NOTE, file=sys.stderr, flush=True)
    # ggml's server loop never returns to Python: let Ctrl+C end the process directly.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _core.serve_rpc_worker(f"{args.host}:{args.port}", devices, args.threads or os.cpu_count() or 1)
    return 0
