"""`localspec quantize` through llama.cpp's quantize API, on the tiny F32 test model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localspec.models.gguf_reader import read_gguf
from localspec.runtime.engine import Engine
from tests.fixtures.helpers import run_localspec as localspec


def plan_json(model: Path) -> dict:
    proc = localspec("plan", "--target", str(model), "--draft", "none", "--device", "cpu",
                     "--ctx", "256", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("qtype, ggml_type", [("F16", "F16"), ("Q8_0", "Q8_0")])
def test_quantize_loads_generates_and_plans(tmp_path: Path, tiny_model_path: Path, qtype: str,
                                            ggml_type: str) -> None:
    out = tmp_path / f"tiny-{qtype}.gguf"
    proc = localspec("quantize", str(tiny_model_path), str(out), "--type", qtype, "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}" in proc.stdout and qtype in proc.stdout

    source, quantized = read_gguf(tiny_model_path), read_gguf(out)
    assert sorted(t.name for t in quantized.tensors) == sorted(t.name for t in source.tensors)
    assert {t.type_name for t in source.tensors} == {"F32"}
    weights = [t for t in quantized.tensors if t.name.endswith(".weight") and len(t.shape) == 2]
    assert any(t.type_name == ggml_type for t in weights)

    # The plan's byte counts are the file's tensor sizes, and smaller than the F32 original's.
    plan, original = plan_json(out), plan_json(tiny_model_path)
    assert plan["target"]["file_bytes"] == out.stat().st_size
    assert plan["target"]["weights_device"] == quantized.tensor_bytes
    assert original["target"]["weights_device"] == source.tensor_bytes
    assert plan["target"]["weights_device"] < original["target"]["weights_device"]

    with Engine.load(out, draft="none", n_ctx=256) as engine:
        result = engine.generate("the quick brown fox", max_tokens=12, temperature=0,
                                 ignore_eos=True)
    assert result.stats.n_tokens == 12 and len(result.tokens) == 12


def test_quantized_copy_is_a_compatible_self_draft(tmp_path: Path, tiny_model_path: Path) -> None:
    out = tmp_path / "self-draft.gguf"
    assert localspec("quantize", str(tiny_model_path), str(out), "--type", "Q8_0").returncode == 0
    proc = localspec("check", "--target", str(tiny_model_path), "--draft", str(out),
                     "--vocab-only")
    assert proc.returncode == 0 and "verdict: compatible" in proc.stdout


def test_user_errors(tmp_path: Path, tiny_model_path: Path) -> None:
    missing = tmp_path / "missing.gguf"
    cases = [
        (["quantize", str(tiny_model_path), str(tmp_path / "o.gguf"), "--type", "Q9_X"],
         "invalid choice"),
        (["quantize", str(missing), str(tmp_path / "o.gguf"), "--type", "F16"],
         "does not exist"),
        (["quantize", str(tiny_model_path), str(tiny_model_path), "--type", "F16"],
         "different file"),
        (["quantize", str(tiny_model_path), str(tmp_path / "no" / "o.gguf"), "--type", "F16"],
         "does not exist"),
    ]
    for argv, fragment in cases:
        proc = localspec(*argv)
        assert proc.returncode == 2, (argv, proc.stderr)
        assert fragment in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o.gguf").exists()
