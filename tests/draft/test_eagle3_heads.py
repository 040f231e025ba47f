"""Tiny EAGLE-3 heads (localspec.testing.heads): the pinned libllama loads them, and a head
given as a model is refused with one sentence before llama.cpp sees it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from localspec.errors import InvalidParameterError, ModelLoadError
from localspec.heads import eagle3
from localspec.models.gguf_reader import read_gguf
from localspec.runtime.engine import Engine
from localspec.testing.heads import HeadSpec, write_eagle3_head

# A separate process: llama_cpp's libllama stays out of the test process (one libllama per
# process, docs/design.md, "Architecture"), and a loader abort could not take pytest down.
LOAD = """
import sys, llama_cpp
llama_cpp.llama_backend_init()
params = llama_cpp.llama_model_default_params()
model = llama_cpp.llama_model_load_from_file(sys.argv[1].encode(), params)
sys.exit(0 if model else 3)
"""


def libllama_loads(path: Path) -> bool:
    proc = subprocess.run([sys.executable, "-c", LOAD, str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode in (0, 3), proc.stderr[-2000:]  # anything else: an abort
    return proc.returncode == 0


@pytest.fixture(scope="module")
def head_path(model_dir: Path, tiny_model_path: Path) -> Path:
    return write_eagle3_head(model_dir / "tiny-eagle3.gguf", tiny_model_path)


def test_layout(head_path: Path, tiny_model_path: Path) -> None:
    head, target = read_gguf(head_path), read_gguf(tiny_model_path)
    assert head.architecture == "eagle3"
    assert head.get("eagle3.target_layers") == [2, 2, 1]  # (2, n/2, n-3) clamped to 4 layers
    assert head.get("eagle3.target_hidden_size") == target.n_embd
    assert head.get("tokenizer.ggml.tokens") == target.get("tokenizer.ggml.tokens")
    names = [t.name for t in head.tensors]
    assert eagle3.unknown_tensors(dict.fromkeys(names)) == []
    d2t = head.tensor("d2t")
    assert d2t is not None and d2t.shape == (128,) and d2t.type_name == "I64"
    assert head.tensor("fc.weight").shape == (3 * target.n_embd, 64)  # type: ignore[union-attr]


def test_libllama_loads_written_heads(head_path: Path, model_dir: Path,
                                      tiny_model_path: Path) -> None:
    assert libllama_loads(head_path)
    full = write_eagle3_head(model_dir / "tiny-eagle3-full.gguf", tiny_model_path,
                             HeadSpec(draft_vocab=0, n_embd=32, n_head=2, n_head_kv=1, seed=2))
    assert read_gguf(full).tensor("d2t") is None
    assert libllama_loads(full)


def test_libllama_refuses_a_broken_head(model_dir: Path, tiny_model_path: Path) -> None:
    """The load check can fail: an extra tensor makes the pinned loader refuse the file."""
    import gguf

    path = model_dir / "tiny-eagle3-extra.gguf"
    write_eagle3_head(path, tiny_model_path)
    reader = gguf.GGUFReader(str(path))
    broken = model_dir / "tiny-eagle3-broken.gguf"
    writer = gguf.GGUFWriter(str(broken), "eagle3")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    writer.add_tensor("blk.0.bogus.weight", np.zeros(8, dtype=np.float32))
    eagle3.finish(writer)
    assert not libllama_loads(broken)


def test_d2t_checks() -> None:
    eagle3.check_d2t(np.array([0, 5, 9]), 10)
    with pytest.raises(InvalidParameterError, match="outside the target's vocabulary of 10"):
        eagle3.check_d2t(np.array([0, 10]), 10)
    with pytest.raises(InvalidParameterError, match="same target token"):
        eagle3.check_d2t(np.array([3, 3]), 10)


def test_head_given_as_a_model_is_refused(head_path: Path, tiny_model_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="eagle3 draft head, not a model"):
        Engine.load(head_path, draft="none")
    with pytest.raises(ModelLoadError, match="eagle3 draft head, not a model"):
        Engine.load(head_path, draft=tiny_model_path)
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.cli", "run", "hello", "--target", str(head_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "eagle3 draft head" in proc.stderr
