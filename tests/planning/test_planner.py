"""The pair memory planner (docs/design.md, "Memory plan"): pure-function cases with made-up device
sizes."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest

from localspec import _core
from localspec.errors import InvalidParameterError
from localspec.models.gguf_reader import read_gguf
from localspec.planning import devices
from localspec.planning import memory as model_memory_module
from localspec.planning.planner import (
    Device,
    GiB,
    MiB,
    ModelMemory,
    choose_device,
    default_device,
    default_reserve,
    format_bytes,
    model_memory,
    parse_size,
    place_model,
    plan_from_files,
    plan_pair,
)
from localspec.planning.table import plan_summary
from tests.fixtures.helpers import run_localspec
from tests.models.test_gguf_reader import write_gguf


@pytest.fixture(autouse=True)
def isolated_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands read models.toml: keep the user's real config and caches out of the tests."""
    monkeypatch.setenv("LOCALSPEC_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("LOCALSPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def make_model(name: str, n_layer: int, layer_mib: float, *, input_mib: float = 200,
               output_mib: float = 200, n_head_kv: int = 4, head_dim: int = 128,
               n_vocab: int = 32000, n_embd: int = 2048, n_ctx_train: int = 32768,
               tied: bool = False) -> ModelMemory:
    extra = input_mib if tied else 0
    return ModelMemory(
        name=name,
        layer_bytes=(int(layer_mib * MiB),) * n_layer,
        input_bytes=int(input_mib * MiB),
        output_bytes=int((output_mib + extra) * MiB),
        kv_k_elems=(n_head_kv * head_dim,) * n_layer,
        kv_v_elems=(n_head_kv * head_dim,) * n_layer,
        n_vocab=n_vocab, n_embd=n_embd, n_ff=4 * n_embd, n_ctx_train=n_ctx_train,
        tied_bytes=int(input_mib * MiB) if tied else 0,
    )


# A 7B-like target (28 x 150 MiB) and a 0.5B-like draft (24 x 12 MiB, tied head).
TARGET = make_model("target-7b", 28, 150, input_mib=400, output_mib=400, n_vocab=152064,
                    n_embd=3584)
DRAFT = make_model("draft-0.5b", 24, 12, input_mib=130, n_head_kv=2, head_dim=64,
                   n_vocab=151936, n_embd=896, tied=True)


def gpu(gib: float) -> Device:
    return Device("GPU0", int(gib * GiB), "gpu")


def test_kv_bytes_per_type_and_padding() -> None:
    model = make_model("m", 2, 1, n_head_kv=8, head_dim=128)  # 1024 K + 1024 V elements/layer
    assert model.kv_bytes(range(2), 256, "f16") == 2 * 256 * 2048 * 2
    assert model.kv_bytes(range(2), 257, "f16") == model.kv_bytes(range(2), 512, "f16")
    assert model.kv_bytes(range(2), 256, "q8_0") == 2 * 256 * 2 * (1024 // 32 * 34)
    assert model.kv_bytes(range(2), 256, "q4_0") == 2 * 256 * 2 * (1024 // 32 * 18)
    assert model.kv_bytes(range(1), 256, "f16") * 2 == model.kv_bytes(range(2), 256, "f16")


def test_all_on_device() -> None:
    plan = plan_pair(TARGET, DRAFT, gpu(24), n_ctx=8192)
    assert plan.fits and plan.reason is None and plan.warnings == ()
    assert plan.target.n_gpu_layers == TARGET.n_layer + 1 and plan.target.output_on_device
    assert plan.draft is not None and plan.draft.n_gpu_layers == DRAFT.n_layer + 1
    assert plan.target.kv_host == 0 and plan.target.weights_host == TARGET.input_bytes
    assert plan.device_bytes + plan.reserve_bytes <= plan.device.free_bytes
    expected_kv = TARGET.kv_bytes(range(28), 8192, "f16")
    assert plan.target.kv_device == expected_kv


def test_target_partly_offloaded() -> None:
    plan = plan_pair(TARGET, DRAFT, gpu(4), n_ctx=4096)
    assert plan.fits
    assert plan.draft is not None and plan.draft.n_gpu_layers == DRAFT.n_layer + 1
    k = plan.target.layers_on_device
    assert 0 < k < TARGET.n_layer and plan.target.n_gpu_layers == k
    assert not plan.target.output_on_device and plan.target.kv_host > 0
    room = plan.device.free_bytes - plan.reserve_bytes - plan.draft.device_bytes
    assert plan.target.device_bytes <= room
    one_more = place_model(TARGET, 4096, "f16", k + 1)
    assert one_more.device_bytes > room  # the planner took as many layers as fit
    assert any(f"only {k} of 28 target layers" in w for w in plan.warnings)
    # weights are conserved: what is not on the device is in host memory
    assert plan.target.weights_device + plan.target.weights_host == TARGET.file_weight_bytes


def test_only_the_output_head_stays_on_the_host() -> None:
    full = place_model(TARGET, 4096, "f16", TARGET.n_layer + 1)
    layers_only = place_model(TARGET, 4096, "f16", TARGET.n_layer)
    budget = layers_only.device_bytes + (full.device_bytes - layers_only.device_bytes) // 2
    plan = plan_pair(TARGET, None, Device("GPU0", budget + 256 * MiB, "gpu"), n_ctx=4096,
                     reserve_bytes=256 * MiB)
    assert plan.target.layers_on_device == TARGET.n_layer and not plan.target.output_on_device
    assert plan.target.n_gpu_layers == TARGET.n_layer
    assert any("output head" in w for w in plan.warnings)


def test_draft_that_does_not_fit() -> None:
    big_draft = make_model("draft-3b", 36, 60, input_mib=300, tied=True)
    plan = plan_pair(TARGET, big_draft, gpu(2), n_ctx=4096)
    assert not plan.fits
    assert plan.reason is not None and "draft model alone needs" in plan.reason
    assert "--draft ngram" in plan.reason


def test_budget_too_small_for_even_the_draft() -> None:
    plan = plan_pair(TARGET, DRAFT, Device("GPU0", 200 * MiB, "gpu"), n_ctx=4096)
    assert not plan.fits
    assert plan.reason is not None and "is smaller than the" in plan.reason
    assert plan.reason.endswith(".") and "\n" not in plan.reason


def test_no_layer_fits_without_a_draft_model() -> None:
    plan = plan_pair(TARGET, None, Device("GPU0", 300 * MiB, "gpu"), n_ctx=4096)
    assert not plan.fits and plan.reason is not None and "Not even one" in plan.reason


def test_draft_on_device_target_on_cpu_is_allowed() -> None:
    room = place_model(DRAFT, 2048, "f16", DRAFT.n_layer + 1).device_bytes
    plan = plan_pair(TARGET, DRAFT, Device("GPU0", room + 10 * MiB, "gpu"), n_ctx=2048,
                     reserve_bytes=10 * MiB)
    assert plan.fits and plan.target.n_gpu_layers == 0
    assert plan.target.weights_host == TARGET.file_weight_bytes


def test_cpu_everything_in_ram() -> None:
    plan = plan_pair(TARGET, DRAFT, Device("CPU", 16 * GiB, "cpu"), n_ctx=4096)
    assert plan.fits
    for placement, model in ((plan.target, TARGET), (plan.draft, DRAFT)):
        assert placement is not None and placement.n_gpu_layers == 0
        assert placement.weights_device == model.file_weight_bytes  # tied head counted once
        assert placement.host_bytes == 0


def test_cpu_does_not_fit() -> None:
    plan = plan_pair(TARGET, DRAFT, Device("CPU", 4 * GiB, "cpu"), n_ctx=4096)
    assert not plan.fits and plan.reason is not None and "of RAM" in plan.reason
    assert plan.reason.startswith("Target and draft need")
    alone = plan_pair(TARGET, None, Device("CPU", 4 * GiB, "cpu"), n_ctx=4096)
    assert not alone.fits and alone.reason is not None
    assert alone.reason.startswith("The target needs")


def test_partial_offload_matches_brute_force() -> None:
    rng = random.Random(1)
    for _ in range(30):
        target = make_model("t", rng.randint(1, 40), rng.uniform(5, 300), n_head_kv=rng.choice(
            [1, 2, 8]), n_vocab=rng.choice([32000, 128256]))
        budget = rng.randint(300, 12000) * MiB
        plan = plan_pair(target, None, Device("G", budget, "gpu"), n_ctx=rng.choice([512, 8192]))
        room = budget - plan.reserve_bytes
        fitting = [k for k in range(target.n_layer + 2)
                   if place_model(target, plan.target.n_ctx, "f16", k).device_bytes <= room]
        best = max(fitting, default=0)
        assert plan.target.n_gpu_layers == (best if best else 0)
        assert plan.fits == (best > 0)


def test_warnings_for_long_context_and_host_ram() -> None:
    plan = plan_pair(TARGET, DRAFT, gpu(4), n_ctx=65536, host_free_bytes=1 * GiB)
    assert any("trained on 32768" in w for w in plan.warnings)
    assert any("exceed the available RAM" in w for w in plan.warnings)


def test_invalid_parameters() -> None:
    with pytest.raises(InvalidParameterError, match="kv_type"):
        plan_pair(TARGET, None, gpu(8), 4096, kv_type="q3")
    with pytest.raises(InvalidParameterError, match="n_ctx"):
        plan_pair(TARGET, None, gpu(8), 0)


def test_reserve() -> None:
    assert default_reserve(gpu(1)) == 256 * MiB
    assert default_reserve(gpu(80)) == 4 * GiB
    assert default_reserve(Device("CPU", 1 * GiB, "cpu")) == 128 * MiB


@pytest.mark.parametrize("text,expected", [
    ("8GiB", 8 * GiB), ("512MiB", 512 * MiB), ("6GB", 6 * 10**9), ("6G", 6 * GiB),
    ("1.5 gib", int(1.5 * GiB)), ("1000", 1000), ("2KB", 2000), ("3k", 3072),
])
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "8 XB", "-1GiB", "8iB", "eight"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(InvalidParameterError, match="is not a size"):
        parse_size(text)


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(235 * MiB + MiB // 2) == "235.5 MiB"
    assert format_bytes(3 * GiB // 2) == "1.50 GiB"


# ---- from real GGUF headers ---------------------------------------------------------------

def test_model_memory_groups_the_file_tensors(tmp_path: Path) -> None:
    for tied in (False, True):
        path = write_gguf(tmp_path / f"m{tied}.gguf", tied=tied, head_count_kv=[2, 1])
        info = read_gguf(path)
        memory = model_memory(path)
        assert memory.n_layer == 2 and (memory.tied_bytes > 0) is tied
        assert memory.file_weight_bytes == info.tensor_bytes
        embd = info.tensor("token_embd.weight")
        assert embd is not None and memory.input_bytes == embd.nbytes
        layer0 = sum(t.nbytes for t in info.tensors if t.name.startswith("blk.0."))
        assert memory.layer_bytes[0] == layer0
        assert memory.kv_k_elems == (2 * 16, 1 * 16)
        assert memory.n_vocab == 40 and memory.n_ctx_train == 256


def test_plan_from_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "ggml_devices", list)  # as on a machine without a GPU
    target = write_gguf(tmp_path / "t.gguf")
    draft = write_gguf(tmp_path / "d.gguf", tied=True)
    plan = plan_from_files(target, draft, 128, budget_bytes=1 * GiB)
    assert plan.device.kind == "cpu" and plan.device.free_bytes == GiB and plan.fits
    assert plan.target.weights_device == read_gguf(target).tensor_bytes
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["target"]["device_bytes"] == plan.target.device_bytes
    text = plan.explain()
    assert "n_gpu_layers" in text and "fits" in text
    gpu_plan = plan_from_files(target, None, 128, 300 * MiB, "q8_0", device=gpu(80))
    assert gpu_plan.device.free_bytes == 300 * MiB and gpu_plan.draft is None


# ---- the `localspec plan` command ----------------------------------------------------------

def run_plan(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from localspec.commands import plan

    parser = argparse.ArgumentParser()
    plan.register(parser.add_subparsers())
    args = parser.parse_args(["plan", *argv])
    code = args.func(args)
    return code, capsys.readouterr().out


def test_plan_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = str(write_gguf(tmp_path / "t.gguf"))
    code, out = run_plan(["--target", target, "--draft", target, "--budget", "1GiB"], capsys)
    assert code == 0 and "n_gpu_layers" in out and "fits" in out
    code, out = run_plan(["--target", target, "--draft", "none", "--device", "gpu", "--budget",
                          "1GiB", "--kv-type", "q8_0", "--ctx", "128", "--json"], capsys)
    data = json.loads(out)
    assert code == 0 and data["draft"] is None and data["kv_type"] == "q8_0"
    assert data["target"]["n_gpu_layers"] == 3
    code, out = run_plan(["--target", target, "--device", "gpu", "--budget", "100MiB"], capsys)
    assert code == 1 and "does NOT fit" in out


def test_plan_command_llama_head_drops_the_head_copies(
    q8_head_model: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_memory_module, "_output_head_supported", lambda: True)
    copies = {}
    for extra in ([], ["--llama-head"]):
        code, out = run_plan(["--target", str(q8_head_model), "--draft", str(q8_head_model),
                              "--device", "cpu", "--json", *extra], capsys)
        data = json.loads(out)
        assert code == 0
        copies[bool(extra)] = (data["target"]["head_copy_device"],
                               data["draft"]["head_copy_device"])
    assert copies[False][0] > 0 and copies[False][0] == copies[False][1]
    assert copies[True] == (0, 0)


def test_plan_command_needs_a_budget_for_a_gpu(tmp_path: Path) -> None:
    from localspec.commands import plan

    parser = argparse.ArgumentParser()
    plan.register(parser.add_subparsers())
    args = parser.parse_args(["plan", "--target", str(tmp_path / "x.gguf"), "--device", "gpu"])
    with pytest.raises(InvalidParameterError, match="--budget"):
        args.func(args)


# ---- choosing the device (ggml's device list is injected) ----------------------------------

CPU_DEV = {"name": "CPU", "description": "AMD EPYC", "kind": "cpu", "free_bytes": 64 * GiB,
           "total_bytes": 64 * GiB}
BLAS_DEV = {"name": "BLAS", "description": "OpenBLAS", "kind": "accel", "free_bytes": 0,
            "total_bytes": 0}


def gpu_dev(name: str, free_gib: float, kind: str = "gpu", total_gib: float = 80) -> dict:
    return {"name": name, "description": f"{name} card", "kind": kind,
            "free_bytes": int(free_gib * GiB), "total_bytes": int(total_gib * GiB)}


def test_cpu_only_machine_plans_for_ram() -> None:
    for listed in ([], [CPU_DEV], [CPU_DEV, BLAS_DEV]):
        # Free RAM moves while other processes run: it must lie between two readings
        # taken around the choice (with 64 MiB of slack), not equal a later one.
        before = devices.system_memory_available()
        device = choose_device(listed)
        after = devices.system_memory_available()
        assert device.kind == "cpu" and device.name == "CPU"
        slack = 64 * 1024 * 1024
        assert min(before, after) - slack <= device.free_bytes <= max(before, after) + slack
        assert device.free_bytes > 0 and device.free_bytes != CPU_DEV["free_bytes"]
        assert choose_device(listed, 3 * GiB) == Device("CPU", 3 * GiB, "cpu")


def test_first_gpu_wins_with_its_free_memory() -> None:
    devices = [CPU_DEV, BLAS_DEV, gpu_dev("CUDA0", 70.5), gpu_dev("CUDA1", 79)]
    device = choose_device(devices)
    assert device == Device("CUDA0 (CUDA0 card)", int(70.5 * GiB), "gpu")
    assert choose_device(devices, 8 * GiB).free_bytes == 8 * GiB  # --budget replaces it


def test_integrated_gpu_and_unknown_free_memory() -> None:
    igpu = gpu_dev("Vulkan0", 0, kind="igpu", total_gib=16)
    device = choose_device([CPU_DEV, igpu])
    assert device.kind == "gpu" and device.free_bytes == 16 * GiB  # free unknown: the total


def test_default_device_uses_the_injected_list() -> None:
    device = default_device(list_devices=lambda: [gpu_dev("Metal", 20)])
    assert device.kind == "gpu" and device.free_bytes == 20 * GiB
    assert default_device(GiB, list_devices=list) == Device("CPU", GiB, "cpu")


def test_default_device_queries_ggml() -> None:
    from localspec import _core

    devices = _core.list_devices()
    assert devices and {"name", "kind", "free_bytes", "total_bytes"} <= set(devices[0])
    # The same device; its free bytes may move between the two queries (other work allocates).
    chosen, expected = default_device(), choose_device(devices)
    assert (chosen.name, chosen.kind) == (expected.name, expected.kind)


def test_plan_command_device_cpu_ignores_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(devices, "ggml_devices", lambda: [CPU_DEV, gpu_dev("CUDA0", 1)])
    target = str(write_gguf(tmp_path / "t.gguf"))
    _, out = run_plan(["--target", target, "--draft", "none", "--json"], capsys)
    assert json.loads(out)["device"]["name"] == "CUDA0 (CUDA0 card)"
    _, out = run_plan(["--target", target, "--draft", "none", "--device", "cpu", "--json"], capsys)
    assert json.loads(out)["device"]["kind"] == "cpu"


def test_plan_summary() -> None:
    cpu = plan_summary(plan_pair(TARGET, DRAFT, Device("CPU", 64 * GiB, "cpu"), n_ctx=4096))
    assert cpu.startswith("CPU RAM: ") and "of 64.00 GiB" in cpu and "draft" in cpu
    assert "\n" not in cpu and "NOT" not in cpu
    partial = plan_summary(plan_pair(TARGET, DRAFT, gpu(3), n_ctx=4096))
    assert partial.startswith("GPU GPU0: target ") and "/28 layers" in partial
    assert "draft all layers" in partial and "host RAM" in partial
    assert plan_summary(plan_pair(TARGET, DRAFT, gpu(0.1), n_ctx=4096)).endswith("does NOT fit")


def test_q8_0_output_head_copies_are_counted_where_they_live() -> None:
    from dataclasses import replace

    copy = 180 * MiB
    target = replace(TARGET, head_copy_bytes=copy)
    draft = replace(DRAFT, head_copy_bytes=copy // 2)  # a draft model's head gets one too
    cpu = Device("CPU", 64 * GiB, "cpu")
    on_cpu = plan_pair(target, draft, cpu, 4096)
    assert on_cpu.target.head_copy_device == copy and on_cpu.target.head_copy_host == 0
    assert on_cpu.draft is not None and on_cpu.draft.head_copy_device == copy // 2
    without = plan_pair(TARGET, DRAFT, cpu, 4096)
    assert on_cpu.device_bytes - without.device_bytes == copy + copy // 2
    # Head on the GPU: llama.cpp computes it there, no copy.
    assert plan_pair(target, None, gpu(80), 4096).target.head_copy_host == 0
    # Head left in host memory (partial offload): the copy is host RAM.
    partial = place_model(target, 4096, "f16", 10)
    assert not partial.output_on_device and partial.head_copy_host == copy
    assert "output head copy" in on_cpu.explain()


def test_head_copy_bytes_come_from_the_gguf_head_type(q8_head_model: Path, q6k_head_model: Path,
                                                      tiny_model_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_memory_module, "_output_head_supported", lambda: True)
    q8 = model_memory(q8_head_model)
    n_groups = -(-q8.n_vocab // 8)
    assert q8.head_copy_bytes == n_groups * (q8.n_embd // 32) * 272 > 0
    assert q8.head_copy_bytes == _core.testing.q8_head_packed_bytes(q8.n_vocab, q8.n_embd)
    q6 = model_memory(q6k_head_model)
    assert q6.head_copy_bytes == _core.testing.q6k_head_packed_bytes(q6.n_vocab, q6.n_embd) > 0
    assert model_memory(tiny_model_path).head_copy_bytes == 0  # an F32 head: llama.cpp's
    # A CPU without AVX-VNNI keeps llama.cpp's head: no copy.
    assert model_memory(q8_head_model, fast_head=False).head_copy_bytes == 0  # --llama-head
    monkeypatch.setattr(model_memory_module, "_output_head_supported", lambda: False)
    assert model_memory(q8_head_model).head_copy_bytes == 0


def test_an_eagle3_head_has_its_own_column(tmp_path: Path, tiny_model_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --draft eagle3:HEAD`: the head's weights, one layer's KV cache, a compute buffer
    of HEAD_UBATCH rows and its draft-vocabulary copy (Q8_0: 34 bytes per 32 values)."""
    from localspec.cli import main
    from localspec.testing.heads import HeadSpec, write_eagle3_head

    head = write_eagle3_head(tmp_path / "head.gguf", tiny_model_path, HeadSpec(draft_vocab=128))
    memory = model_memory(head)
    assert memory.is_head and memory.n_layer == 1
    assert memory.head_copy_bytes == 128 * 2 * 34
    assert main(["plan", "--target", str(tiny_model_path), "--draft", f"eagle3:{head}",
                 "--budget", "8GiB"]) == 0
    out = capsys.readouterr().out
    assert "EAGLE-3 head" in out and "tiny-eagle3-head" in out


def test_parallel_generations_multiply_the_target_kv() -> None:
    """Batched serving keeps n_seq contexts in one KV cache: the plan counts all of them, so a
    pair that fits for one generation may not fit for eight."""
    one = plan_pair(TARGET, None, gpu(24), n_ctx=8192)
    four = plan_pair(TARGET, None, gpu(24), n_ctx=8192, n_seq=4)
    assert four.target.kv_device == 4 * one.target.kv_device and four.target.n_seq == 4
    assert four.target.weights_device == one.target.weights_device
    cpu = Device("CPU", 6 * GiB, "cpu")
    assert plan_pair(TARGET, None, cpu, n_ctx=8192).fits
    assert not plan_pair(TARGET, None, cpu, n_ctx=8192, n_seq=8).fits


def test_plan_parallel_counts_what_the_engine_will_share(tiny_model_path: Path,
                                                         tiny_draft_path: Path) -> None:
    """`plan --parallel N` (as `serve --parallel N`) shows N contexts for the n-gram drafter,
    and for a draft model N in both models' caches (it keeps a cache per generation)."""
    def plan(draft: str, *extra: str) -> dict:
        proc = run_localspec("plan", "--target", str(tiny_model_path), "--draft", draft,
                             "--json", *extra)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    alone, four = plan("ngram"), plan("ngram", "--parallel", "4")
    assert four["target"]["n_seq"] == 4
    assert four["target"]["kv_device"] == 4 * alone["target"]["kv_device"]
    draft = str(tiny_draft_path)
    pair_alone, pair_four = plan(draft), plan(draft, "--parallel", "4")
    assert pair_four["target"]["n_seq"] == pair_four["draft"]["n_seq"] == 4
    assert pair_four["draft"]["kv_device"] == 4 * pair_alone["draft"]["kv_device"]
    proc = run_localspec("plan", "--target", str(tiny_model_path), "--parallel", "0")
    assert proc.returncode == 2 and "--parallel 0 is invalid: use 1 to 64." in proc.stderr
