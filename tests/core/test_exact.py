"""Exact mode (docs/exact.md): every target row gets the same logits bits whatever the number
of rows in its pass, so speculative greedy output equals plain greedy output exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gguf import GGMLQuantizationType, GGUFReader

from localspec import _core
from localspec.bench.invariance import differing_row_counts
from localspec.bench.prompts import load_prompts
from localspec.commands.limits import has_gpu_backend
from localspec.drafter_spec import DrafterSpec
from localspec.errors import InvalidParameterError
from localspec.planning.memory import draft_widened_types, model_memory, widened_types
from localspec.runtime.engine import Engine
from localspec.testing.heads import HeadSpec, write_eagle3_head
from localspec.testing.synthetic import TinyConfig, write_model, write_pair
from localspec.types import GenerationParams

# Realistic width: llama.cpp repacks Q4_K weights of this shape (its batched rows then differ).
WIDE = TinyConfig(n_embd=1024, n_head=8, n_head_kv=4, n_ff=2048, seed=11)
TYPES = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q5_0", "Q4_0", "F16"]
TEXT = " ".join(p.text for p in load_prompts(limit_per_category=1))


@pytest.fixture(scope="session")
def wide_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("exact")
    f32 = write_model(directory / "wide-f32.gguf", WIDE, name="wide")
    out = {}
    for qtype in TYPES:
        out[qtype] = directory / f"wide-{qtype}.gguf"
        _core.quantize(str(f32), str(out[qtype]), qtype, 2)
    return out


def exact_head(qtype: str) -> str:
    """The head exact mode computes with: a batched one for Q6_K and Q8_0 head weights (what
    the quantized models' heads are) on a CPU with its kernels, ExactHead otherwise."""
    if qtype == "F16" or not _core.testing.q8_head_kernels():
        return "localspec-exact"
    return "localspec-q8_0" if qtype == "Q8_0" else "localspec-q6_k"


def _tokens(engine: Engine, n: int) -> list[int]:
    tokens = engine.tokenize(TEXT * 4)
    assert len(tokens) >= n
    return tokens[:n]


@pytest.mark.parametrize("qtype", TYPES)
# 600: past the 512-entry KV split of attention; 529: a prefill of 513 tokens, one graph of
# 512 rows and one of a single row
@pytest.mark.parametrize("n_tokens", [48, 529, 600])
def test_exact_rows_are_batch_invariant(wide_models: dict[str, Path], qtype: str,
                                        n_tokens: int) -> None:
    """Passes of 1 .. 16 rows give every row the bits of its single-token pass."""
    with Engine.load(wide_models[qtype], draft="none", n_ctx=1024, n_threads=1,
                     exact=True, n_gpu_layers=0) as engine:
        assert engine.info.exact and engine.info.verify_head == exact_head(qtype)
        assert differing_row_counts(engine, _tokens(engine, n_tokens)) == []


def body_matrices(path: Path, types: set[str] | None = None) -> int:
    """The quantized matrices of the transformer body (every layer's 2-D weights), of the
    given types only if any."""
    reader = GGUFReader(path)
    return sum(1 for t in reader.tensors if t.name.startswith("blk.") and len(t.shape) == 2
               and t.tensor_type not in (GGMLQuantizationType.F16, GGMLQuantizationType.F32)
               and (types is None or t.tensor_type.name in types))


@pytest.mark.skipif(not _core.testing.body_kernels_available(),
                    reason="localspec's body kernels need x86-64 with AVX2")
@pytest.mark.parametrize("qtype", TYPES)
def test_exact_mode_computes_the_body_with_localspec_kernels(wide_models: dict[str, Path],
                                                             qtype: str) -> None:
    """An exact target puts every quantized body matrix in localspec's buffer type
    (csrc/kernels/body_matmul.h); a default-mode target those of the types where localspec's kernels
    are faster (Q8_0, Q5_0, Q4_K and Q6_K), none with
    ``fast_body=False``. A GPU build keeps a default-mode target's CPU-held matrices in the
    GPU's pinned memory instead (llama.cpp computes its prompts there)."""
    path = wide_models[qtype]

    def placed(**options: Any) -> int:
        before = _core.testing.body_kernel_tensors()
        with Engine.load(path, draft="none", n_ctx=256, n_threads=1, n_gpu_layers=0, **options):
            return _core.testing.body_kernel_tensors() - before

    assert placed(fast_body=False) == 0
    faster = 0 if has_gpu_backend() else body_matrices(path, set(_core.faster_body_types()))
    assert placed() == faster
    assert placed(exact=True) == body_matrices(path) > (0 if qtype != "F16" else -1)


@pytest.mark.skipif(not _core.testing.body_kernels_available() or has_gpu_backend(),
                    reason="localspec's body kernels need x86-64 with AVX2 and a CPU-only build")
def test_a_draft_model_takes_the_faster_kernels_in_both_modes(
        wide_models: dict[str, Path]) -> None:
    """A draft model's matrices of the faster types go to localspec's kernels (Qwen2.5-Coder
    0.5B's are mostly Q5_0), also beside an exact-mode target: a draft is only a proposal."""
    target, draft = wide_models["Q4_0"], wide_models["Q5_0"]

    def placed(**options: Any) -> int:
        before = _core.testing.body_kernel_tensors()
        with Engine.load(target, n_ctx=256, n_threads=1, n_gpu_layers=0, **options):
            return _core.testing.body_kernel_tensors() - before

    faster = body_matrices(draft, set(_core.faster_body_types()))
    assert faster > 0
    assert placed(draft=str(draft)) - placed(draft="none") == faster
    assert placed(draft=str(draft), exact=True) - placed(draft="none", exact=True) == faster
    assert placed(draft=str(draft), fast_body=False) == 0
    spec = DrafterSpec.parse(str(draft))
    assert draft_widened_types(spec, fast_body=True) == ("Q5_0", "Q4_K")  # the plan counts them
    assert draft_widened_types(DrafterSpec("eagle3", str(draft)), fast_body=True) == ()
    assert draft_widened_types(DrafterSpec("ngram"), fast_body=True) == ()


def test_memory_plan_counts_the_widened_matrices(wide_models: dict[str, Path]) -> None:
    """Exact mode holds Q5_0 body matrices as int8 (34 bytes per 32 values, not 22): the memory
    plan counts them so."""
    q5_0 = sum(t.n_bytes for t in GGUFReader(wide_models["Q5_0"]).tensors
               if t.name.startswith("blk.") and t.tensor_type == GGMLQuantizationType.Q5_0)
    assert q5_0 > 0
    plain = sum(model_memory(wide_models["Q5_0"]).layer_bytes)
    widened = sum(model_memory(wide_models["Q5_0"],
                               widened=widened_types(exact=True, fast_body=False)).layer_bytes)
    expected = q5_0 // 22 * 12 if _core.testing.body_kernels_available() else 0
    assert widened - plain == expected


def test_the_plan_widens_what_the_core_places() -> None:
    """The memory plan's mirror of the core's placement: default mode widens the faster types
    it takes (Q5_0, and Q4_K where AVX-512's kernels take it) on a CPU-only build, nothing
    where a GPU backend's pinned memory takes the CPU-held matrices (exact mode skips that
    memory: it widens every type), with --no-repack, or over RPC."""
    assert widened_types(exact=False, fast_body=True, faster=("Q8_0", "Q5_0")) == ("Q5_0",)
    assert widened_types(exact=False, fast_body=True,
                         faster=("Q8_0", "Q5_0", "Q4_K", "Q6_K")) == ("Q5_0", "Q4_K")
    expected = ("Q5_0", "Q4_K") if "Q4_K" in _core.faster_body_types() else ("Q5_0",)
    assert widened_types(exact=False, fast_body=True) == expected
    assert widened_types(exact=False, fast_body=True, gpu_backend=True) == ()
    assert widened_types(exact=False, fast_body=True, repack=False) == ()
    assert widened_types(exact=True, fast_body=True, gpu_backend=True) == ("Q5_0", "Q4_0", "Q4_K")
    assert widened_types(exact=True, fast_body=True, rpc=True) == ()


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_exact_rows_are_batch_invariant_over_two_threads(wide_models: dict[str, Path],
                                                         kv_type: str) -> None:
    """Past ~256 tokens llama.cpp's flash attention splits an F16 cache over the threads for a
    one-row pass (its bits then differ from every larger pass); exact mode's reference kernels
    do not, whatever the cache type. One thread would hide that."""
    with Engine.load(wide_models["Q4_K_M"], draft="none", n_ctx=1024, n_threads=2,
                     kv_type=kv_type, exact=True, n_gpu_layers=0) as engine:
        assert differing_row_counts(engine, _tokens(engine, 600)) == []


def test_default_mode_rows_differ(wide_models: dict[str, Path]) -> None:
    """Without exact mode llama.cpp's repacked Q4_K kernels give batched rows other bits: the
    invariance check can fail."""
    with Engine.load(wide_models["Q4_K_M"], draft="none", n_ctx=1024, n_threads=1,
                     fast_body=False) as engine:
        assert not engine.info.exact
        assert differing_row_counts(engine, _tokens(engine, 48)) != []


def test_no_repack_keeps_the_one_row_kernels_of_small_passes(
        wide_models: dict[str, Path]) -> None:
    """LoadOptions.repack=False (--no-repack) loads the weights in their file layout: passes of
    up to 7 rows then give every row its single-token bits, where llama.cpp's repacked Q4_K
    layout differs from 4 rows (docs/exact.md's table). So do exact mode's kernels
    (localspec's Q4_K and Q6_K kernels here). A GPU build never repacks CPU-held weights: it
    keeps them in the file layout, in the GPU's pinned memory."""
    loads: dict[str, dict[str, bool]] = {"llama.cpp repacked": {"fast_body": False},
                                         "file layout": {"repack": False}, "exact": {"exact": True}}
    small: dict[str, list[int]] = {}
    for name, options in loads.items():
        with Engine.load(wide_models["Q4_K_M"], draft="none", n_ctx=1024, n_threads=1,
                         n_gpu_layers=0, **options) as engine:
            rows = differing_row_counts(engine, _tokens(engine, 48))
            small[name] = [r for r in rows if r < 8]
    assert bool(small["llama.cpp repacked"]) == (not has_gpu_backend())
    assert small["file layout"] == small["exact"] == []


@pytest.fixture(scope="module")
def exact_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Engine]]:
    """A wide Q4_K_M target in exact mode with an n-gram and a draft-model drafter."""
    directory = tmp_path_factory.mktemp("exact-pair")
    target_f32, draft_f32 = write_pair(directory, WIDE, divergence=0.1)
    target, draft = directory / "target-q4_k_m.gguf", directory / "draft-q8_0.gguf"
    _core.quantize(str(target_f32), str(target), "Q4_K_M", 2)
    _core.quantize(str(draft_f32), str(draft), "Q8_0", 2)
    engines = {
        "ngram": Engine.load(target, draft="ngram", n_ctx=4096, n_threads=1, exact=True,
                             n_gpu_layers=0),
        "model": Engine.load(target, draft=draft, n_ctx=4096, n_threads=1, exact=True,
                             n_gpu_layers=0, draft_p_min=0.0),
    }
    yield engines
    for engine in engines.values():
        engine.close()


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_exact_speculative_equals_plain(exact_pair: dict[str, Engine], drafter: str) -> None:
    """Greedy, every built-in category, `auto` and fixed draft lengths: the same tokens."""
    engine = exact_pair[drafter]
    greedy = GenerationParams(temperature=0.0, max_tokens=64, ignore_eos=True, seed=0)
    drafted = 0
    for prompt in load_prompts(limit_per_category=1):
        plain = engine.generate(prompt.text, greedy, speculative=False).tokens
        for k in ("auto", 3, 15):
            result = engine.generate(prompt.text, greedy, draft_max=k)
            assert result.tokens == plain, (prompt.id, k)
            drafted += result.stats.drafted
    assert drafted > 0  # speculation really ran


def test_exact_seeded_sampling_equals_plain(exact_pair: dict[str, Engine]) -> None:
    """A deterministic drafter (n-gram) and a seed: the same sample as plain decoding."""
    engine = exact_pair["ngram"]
    params = GenerationParams(temperature=0.8, max_tokens=64, ignore_eos=True, seed=7)
    for prompt in load_prompts(limit_per_category=1)[:3]:
        plain = engine.generate(prompt.text, params, speculative=False).tokens
        assert engine.generate(prompt.text, params, draft_max=4).tokens == plain


@pytest.mark.parametrize("spelling", ["eagle3:", ""])
def test_exact_eagle3_head_equals_plain(wide_models: dict[str, Path], model_dir: Path,
                                        spelling: str) -> None:
    """An EAGLE-3 head on a quantized target in exact mode, chained with n-gram lookup or alone:
    greedy and seeded sampling (greedy head drafts: a deterministic drafter) give plain
    decoding's tokens exactly, with drafts accepted and rejected."""
    head = write_eagle3_head(model_dir / "exact-e3.gguf", wide_models["Q4_K_M"],
                             HeadSpec(n_embd=1024, n_head=8, n_head_kv=4, n_ff=256, draft_vocab=0,
                                      target_layers=(1, 1, 1),
                                      scale=0.3, seed=4))
    with Engine.load(wide_models["Q4_K_M"], draft=f"{spelling}{head}", n_ctx=4096, n_threads=1,
                     exact=True, n_gpu_layers=0, draft_p_min=0.0, draft_sampling=False) as engine:
        assert engine.info.exact
        drafted = rejected = 0
        for params in (GenerationParams(temperature=0.0, max_tokens=48, ignore_eos=True, seed=0),
                       GenerationParams(temperature=0.8, max_tokens=48, ignore_eos=True, seed=7)):
            for prompt in load_prompts(limit_per_category=1)[:3]:
                plain = engine.generate(prompt.text, params, speculative=False).tokens
                for k in ("auto", 3):
                    result = engine.generate(prompt.text, params, draft_max=k)
                    assert result.tokens == plain, (prompt.id, params.temperature, k)
                    drafted += result.stats.drafted_by_kind["eagle3"]
                    rejected += result.stats.rejected
    assert drafted > 0 and rejected > 0


@pytest.mark.parametrize("qtype", ["Q4_K_M", "F16"])
def test_exact_parallel_generations_equal_each_run_alone(wide_models: dict[str, Path],
                                                          qtype: str) -> None:
    """--parallel in exact mode: each generation has a KV stream of its own (another's cells
    would change its attention's low bits) and the generations take turns; every token and
    every logprob is bit-identical to the same request run alone, greedy and seeded."""
    prompts = ["the quick brown fox", "hello world, this is", "def main(): return",
               "the cat sat on the mat and the dog sat on the log. the cat sat",
               "one two three four one two three"]
    runs = [GenerationParams(temperature=0.0, max_tokens=60, ignore_eos=True, logprobs=True,
                             draft_max=3),
            GenerationParams(temperature=0.8, max_tokens=60, ignore_eos=True, logprobs=True,
                             seed=7, draft_max=3)]
    # Two threads: with one cache shared by all generations, attention then differs in the
    # low bits (this test failed that way before each generation had a stream of its own).
    options = {"draft": "ngram", "n_ctx": 4096, "n_threads": 2, "exact": True,
               "n_gpu_layers": 0}
    with Engine.load(wide_models[qtype], **options) as solo:
        expected = [[solo.generate(p, params) for p in prompts] for params in runs]
    with Engine.load(wide_models[qtype], parallel=4, **options) as batched:
        assert batched.info.parallel == 4 and not batched.info.notice
        for params, alone in zip(runs, expected, strict=True):
            handles = [batched.submit(p, params) for p in prompts]
            for handle, want in zip(handles, alone, strict=True):
                got = handle.result(timeout=300)
                assert got.tokens == want.tokens
                assert got.logprobs is not None and want.logprobs is not None
                assert [t.logprob for t in got.logprobs] == [t.logprob for t in want.logprobs]


def test_exact_mode_is_a_choice_of_its_own_context(wide_models: dict[str, Path]) -> None:
    """Exact mode asks for ggml's reference CPU kernels on its own context only: an engine in
    default mode that ran before it and runs beside it keeps llama.cpp's tiled K-quant matmul
    (with repack off, its passes of 8 rows and more differ), and exact mode works after it."""
    path = wide_models["Q4_K_M"]
    with Engine.load(path, draft="none", n_ctx=1024, n_threads=1, repack=False) as default:
        tokens = _tokens(default, 48)
        before = differing_row_counts(default, tokens)
        with Engine.load(path, draft="none", n_ctx=1024, n_threads=1, exact=True,
                         n_gpu_layers=0) as exact:
            assert differing_row_counts(exact, tokens) == []
        after = differing_row_counts(default, tokens)
    assert before and after == before


def test_exact_f16_speculative_equals_plain(wide_models: dict[str, Path]) -> None:
    """F16 weights (single rows padded to two, docs/exact.md): speculation changes nothing."""
    greedy = GenerationParams(temperature=0.0, max_tokens=48, ignore_eos=True, seed=0)
    with Engine.load(wide_models["F16"], draft="ngram", n_ctx=4096, n_threads=1,
                     exact=True, n_gpu_layers=0) as engine:
        for prompt in load_prompts(limit_per_category=1)[:3]:
            plain = engine.generate(prompt.text, greedy, speculative=False).tokens
            for k in ("auto", 15):
                assert engine.generate(prompt.text, greedy, draft_max=k).tokens == plain


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI on one thread, every layer on the CPU (exact mode's backend, also in GPU builds)."""
    return subprocess.run([sys.executable, "-m", "localspec.cli", *args, "--threads", "1",
                           "--n-gpu-layers", "0"],
                          capture_output=True, text=True, timeout=600)


def test_bench_and_check_say_which_mode_ran(wide_models: dict[str, Path],
                                            prompt_file: Path) -> None:
    """bench --exact names the mode and checks 1 .. 16-row passes on the model it measured;
    check names the mode; without --exact both say "default"."""
    model = str(wide_models["Q4_K_M"])
    common = ["--target", model, "--draft", "ngram", "--max-tokens", "24", "--json"]
    proc = cli("bench", *common, "--prompts", str(prompt_file), "--exact")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["mode"] == "exact" and out["rows_differing"] == []
    assert out["overall"]["identical"] == "yes"
    default = json.loads(cli("bench", *common, "--prompts", str(prompt_file)).stdout)
    assert default["mode"] == "default" and "rows_differing" not in default
    proc = cli("check", *common[:-1], "--limit", "1", "--categories", "qa", "--exact")
    assert proc.returncode == 0, proc.stderr
    assert "Mode: exact (batch-invariant passes: any difference from plain output is a bug)" \
        in proc.stdout


def test_bench_runs_both_modes_interleaved(wide_models: dict[str, Path],
                                           prompt_file: Path) -> None:
    """--modes default,exact: each mode in its own process, both reported, and exact / default
    from repeats paired across the modes (what decides exact mode's default, docs/exact.md)."""
    proc = cli("bench", "--target", str(wide_models["Q4_K_M"]), "--draft", "ngram",
               "--max-tokens", "24", "--json", "--prompts", str(prompt_file), "--repeat", "2",
               "--modes", "default,exact")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    default, exact = out["modes"]["default"], out["modes"]["exact"]
    assert default["mode"] == "default" and "rows_differing" not in default
    assert exact["mode"] == "exact" and exact["rows_differing"] == []
    assert exact["verify_head"] == exact_head("Q4_K_M") and exact["overall"]["identical"] == "yes"
    for mode in (default, exact):
        assert mode["overall"]["n_runs"] == 2 * len(mode["prompts"])
    spec = out["exact_vs_default"]["speculative"]
    expected = exact["overall"]["speculative_tps"] / default["overall"]["speculative_tps"]
    assert spec["overall"] == pytest.approx(expected, rel=1e-6)
    assert set(spec["categories"]) == {c["label"] for c in exact["categories"]}
    # Both modes replayed both schedules of every prompt (greedy), past any near-tie.
    same = out["exact_vs_default"]["same_passes"]
    assert same["skipped"] == 0
    assert 0.2 < same["overall"] < 5 and set(same["categories"]) <= set(spec["categories"])


def test_bench_modes_refuses_what_it_cannot_combine(wide_models: dict[str, Path]) -> None:
    proc = cli("bench", "--target", str(wide_models["Q4_K_M"]), "--modes", "default,exact",
               "--exact")
    assert proc.returncode == 2
    assert "--modes default,exact runs its own engines: leave out --exact." in proc.stderr


def test_a_request_can_require_exact_mode(exact_pair: dict[str, Engine],
                                          tiny_model_path: Path) -> None:
    """The per-request field: an exact engine (and a real server on it) serves exact=true and
    says which mode ran; an engine in default mode refuses it with one sentence (HTTP 400)."""
    import httpx

    from localspec.server import create_app
    from localspec.server.background import BackgroundServer

    engine = exact_pair["ngram"]
    greedy = GenerationParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    assert engine.generate("the quick", greedy, exact=True).tokens == engine.generate(
        "the quick", greedy, speculative=False).tokens
    with BackgroundServer(create_app(engine)) as server:
        body = {"model": engine.info.target_name, "prompt": "the quick", "max_tokens": 8,
                "temperature": 0, "exact": True}
        response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["localspec"]["exact"] is True
    with Engine.load(tiny_model_path, draft="ngram", n_threads=1) as default_mode:
        with pytest.raises(InvalidParameterError, match="loaded in default mode"):
            default_mode.generate("the quick", greedy, exact=True)


def test_exact_mode_refuses_to_run_the_target_on_a_gpu() -> None:
    """On CUDA, passes of 2 or more rows differ from single-token passes in exact mode too
    (docs/gpu.md): exact mode asks for the CPU backend instead of breaking its promise."""
    from dataclasses import replace

    from localspec.runtime.loading import LoadOptions, check_exact_backend

    cpu = {"name": "CPU", "description": "a CPU", "kind": "cpu"}
    gpu = {"name": "CUDA0", "description": "NVIDIA H200", "kind": "gpu"}
    options = LoadOptions(target="t.gguf", exact=True)
    with pytest.raises(InvalidParameterError, match=r"NVIDIA H200; add --n-gpu-layers 0"):
        check_exact_backend(options, [gpu, cpu])
    check_exact_backend(replace(options, n_gpu_layers=0), [gpu, cpu])  # layers on the CPU
    check_exact_backend(options, [cpu])  # a CPU-only build
    check_exact_backend(replace(options, exact=False), [gpu, cpu])


def test_bench_compares_llama_cpp_body_kernels_with_localspecs(wide_models: dict[str, Path],
                                                               prompt_file: Path) -> None:
    """--modes llama-body,default: the same pair with the body's Q8_0/Q5_0 matrices by
    llama.cpp's kernels and by localspec's, each in its own process, default / llama-body."""
    proc = cli("bench", "--target", str(wide_models["Q8_0"]), "--draft", "ngram",
               "--max-tokens", "16", "--json", "--prompts", str(prompt_file), "--repeat", "1",
               "--modes", "llama-body,default")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out["modes"]) == {"llama-body", "default"}
    for mode in out["modes"].values():
        assert mode["overall"]["identical"] in ("yes", "tie")
    spec = out["default_vs_llama-body"]["speculative"]
    expected = (out["modes"]["default"]["overall"]["speculative_tps"]
                / out["modes"]["llama-body"]["overall"]["speculative_tps"])
    assert spec["overall"] == pytest.approx(expected, rel=1e-6)
