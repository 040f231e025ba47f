"""Write the generated Q4_K_M model of realistic width that exact mode's cost is measured on
(docs/exact.md, "What it costs"): Gemma 3's body types are never repacked by llama.cpp, so it
alone cannot say what exact mode gives up; this llama-architecture model, 2048 wide (16 heads of
128, 4 KV heads, FFN 5632, TinyLlama-1.1B's shapes) with 4 blocks and a Q8_0 output head over a
32k vocabulary, has the Q4_K matrices llama.cpp repacks.

    python benchmarks/exact_wide_model.py OUT_DIR
    localspec bench --target OUT_DIR/wide-q4_k_m.gguf ...
"""

from __future__ import annotations

import sys
from pathlib import Path

from localspec import _core
from localspec.testing.synthetic import TinyConfig, write_model

WIDE = TinyConfig(n_embd=2048, n_head=16, n_head_kv=4, n_ff=5632, n_layer=4, head_type="Q8_0",
                  extra_tokens=32000 - 376, seed=5)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    f32 = write_model(out / "wide-f32.gguf", WIDE, name="wide-llama")
    target = out / "wide-q4_k_m.gguf"
    _core.quantize(str(f32), str(target), "Q4_K_M", 2)
    f32.unlink()
    print(target)


if __name__ == "__main__":
    main()
