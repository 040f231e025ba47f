"""Measure which settings make target rows batch-invariant (the table in docs/exact.md).

    python benchmarks/exact_measure.py [--gemma PATH] [--out DIR]

For each model (the embedded Gemma 3 270M and tiny generated models of realistic width in the
models.toml types) and each setting, a fresh process (llama.cpp reads some kernel choices once
per process) runs the same positions as passes of 1 .. 16 rows and as single-token passes, at
a short (48 tokens) and a long (600 tokens: attention past its 512-entry KV split) context, and
prints the row counts whose logits bits differ.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SETTINGS: dict[str, dict[str, object]] = {
    "default": {},
    "repack off": {"repack": False},
    "repack off, flash attn off": {"repack": False, "flash_attn": 0},
    "repack off, flash attn on, KV q8_0": {"repack": False, "flash_attn": 1, "kv_type": "q8_0"},
    "... + tiled K-quant matmul off": {"repack": False, "flash_attn": 1, "kv_type": "q8_0",
                                       "tiled": False},
    "exact (repack off, flash attn on, ggml's reference kernels, localspec's head)": {
        "exact": True},
    "exact, KV q8_0": {"exact": True, "kv_type": "q8_0"},
    "exact, 1 thread": {"exact": True, "threads": 1},
}
TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16")

CHILD = """
import json, sys
from localspec import _core
from localspec.bench.invariance import differing_row_counts
from localspec.bench.prompts import load_prompts
path, settings = sys.argv[1], json.loads(sys.argv[2])
options = _core.EngineOptions()
options.target_path, options.drafter_kind, options.n_ctx = path, "none", 2048
options.n_threads = settings.pop("threads", 2)
for key, value in settings.items():
    setattr(options, key, value)
core = _core.Core(options)
text = " ".join(p.text for p in load_prompts(limit_per_category=1)) * 2
tokens = core.tokenize(text, True, False)
out = [differing_row_counts(core, tokens[:n]) for n in (48, 600)]
print(json.dumps({"head": core.verify_head(), "differs": out}))
"""


def wide_models(directory: Path) -> dict[str, Path]:
    from localspec import _core
    from localspec.testing.synthetic import TinyConfig, write_model

    f32 = write_model(directory / "wide-f32.gguf",
                      TinyConfig(n_embd=1024, n_head=8, n_head_kv=4, n_ff=2048, seed=11))
    out = {}
    for qtype in TYPES:
        out[f"tiny 1024-wide {qtype}"] = directory / f"wide-{qtype}.gguf"
        if not out[f"tiny 1024-wide {qtype}"].exists():
            _core.quantize(str(f32), str(out[f"tiny 1024-wide {qtype}"]), qtype, 2)
    return out


def measure(path: Path, settings: dict[str, object]) -> dict[str, object]:
    settings = dict(settings)
    env = dict(os.environ)
    env.pop("GGML_CPU_TILED_MM", None)
    if settings.pop("tiled", True) is False:
        env["GGML_CPU_TILED_MM"] = "0"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), json.dumps(settings)],
                          capture_output=True, text=True, env=env, check=True)
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def rows_text(rows: list[int]) -> str:
    if not rows:
        return "none"
    if rows == list(range(rows[0], 17)):
        return f"{rows[0]}-16"
    return ",".join(map(str, rows))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gemma", help="the embedded Gemma GGUF (default: from the cache)")
    parser.add_argument("--out", default="/tmp/localspec-exact", help="where the models go")
    parser.add_argument("--settings", default="",
                        help="only the settings whose label starts with this (default: all)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from localspec.models import registry

    gemma = Path(args.gemma) if args.gemma else Path(str(registry.load_registry().resolve_model(
        "gemma3-270m")))
    models = {"Gemma 3 270M Q4_K_M": gemma, **wide_models(out)}
    print("| model | setting | head | rows differing, 48 ctx | rows differing, 600 ctx |")
    print("|---|---|---|---|---|")
    for name, path in models.items():
        for label, settings in SETTINGS.items():
            if not label.startswith(args.settings):
                continue
            result = measure(path, settings)
            short, long = result["differs"]  # type: ignore[misc]
            print(f"| {name} | {label} | {result['head']} | {rows_text(short)} | "
                  f"{rows_text(long)} |", flush=True)


if __name__ == "__main__":
    main()
