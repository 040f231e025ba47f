"""The engine loads by the memory plan: a pair that does not fit is refused before loading,
and the plan's n_gpu_layers reach Engine.load unless --n-gpu-layers is given."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from localspec.commands import common
from localspec.commands.common import ModelChoice, load_engine, plan_for, plan_summary
from localspec.errors import ModelLoadError
from localspec.planning.planner import Device, GiB, model_memory, plan_pair
from localspec.runtime.loading import LoadOptions
from tests.fixtures.helpers import run_localspec as localspec

LOAD_LOG = ("llama_model_load", "load_tensors")  # what llama.cpp logs (--verbose) when loading


def run_args(target: Path, draft: Path, *extra: str) -> list[str]:
    return ["run", "hello", "--target", str(target), "--draft", str(draft), "--temperature", "0",
            "--max-tokens", "8", "--verbose", *extra]


def test_budget_too_small_is_refused_before_loading(tiny_model_path: Path,
                                                    tiny_draft_path: Path) -> None:
    proc = localspec(*run_args(tiny_model_path, tiny_draft_path, "--budget", "1MiB"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    expected = plan_for(tiny_model_path, str(tiny_draft_path), 4096, "1MiB").reason
    assert expected and proc.stderr.strip() == f"localspec: error: {expected}"
    assert not any(marker in proc.stderr for marker in LOAD_LOG)  # nothing was loaded


def test_pair_larger_than_the_budget_is_refused(tiny_model_path: Path,
                                                tiny_draft_path: Path) -> None:
    # Room for the reserve and the draft, but not for the target as well.
    probe = plan_for(tiny_model_path, str(tiny_draft_path), 4096, 1 * GiB)
    assert probe.draft is not None
    # (the reserve is the budget's floor here: 128 MiB of RAM, 256 MiB of a GPU's memory)
    budget = probe.reserve_bytes + probe.draft.device_bytes + probe.target.device_bytes // 2
    plan = plan_for(tiny_model_path, str(tiny_draft_path), 4096, budget)
    assert not plan.fits and plan.reason and "Target and draft need" in plan.reason
    for extra in ([], ["--n-gpu-layers", "0"]):  # a plan for RAM binds even with the option
        proc = localspec(*run_args(tiny_model_path, tiny_draft_path, "--budget", str(budget),
                                   *extra))
        assert proc.returncode == 2 and plan.reason in proc.stderr
        assert not any(marker in proc.stderr for marker in LOAD_LOG)


def test_sufficient_budget_runs(tiny_model_path: Path, tiny_draft_path: Path) -> None:
    proc = localspec(*run_args(tiny_model_path, tiny_draft_path, "--budget", "1GiB"))
    assert proc.returncode == 0, proc.stderr
    assert "8 tokens" in proc.stderr and any(marker in proc.stderr for marker in LOAD_LOG)


def test_bad_budget_is_a_user_error(tiny_model_path: Path, tiny_draft_path: Path) -> None:
    proc = localspec(*run_args(tiny_model_path, tiny_draft_path, "--budget", "lots"))
    assert proc.returncode == 2 and "is not a size" in proc.stderr


# ---- what load_engine passes to the Engine (the load itself is replaced) ------------------

@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def fake_engine(options: LoadOptions) -> Any:
        calls.append({**asdict(options), "draft": str(options.draft)})
        return SimpleNamespace(info=SimpleNamespace(notice=""))  # what load_engine reads

    monkeypatch.setattr(common, "Engine", fake_engine)
    return calls


def namespace(**overrides: Any) -> argparse.Namespace:
    values = {"threads": None, "verbose": False, "n_gpu_layers": None, "budget": None,
              "kv_type": "f16", "llama_head": False, "llama_body": False,
              "no_repack": False}
    return argparse.Namespace(**{**values, **overrides})


def gpu_plan(target: Path, draft: Path, budget: int) -> Any:
    return plan_pair(model_memory(target), model_memory(draft), Device("GPU0", budget, "gpu"),
                     n_ctx=256, reserve_bytes=0)


def test_plan_layers_reach_the_engine(tiny_model_path: Path, tiny_draft_path: Path,
                                      loads: list[dict[str, Any]]) -> None:
    choice = ModelChoice(str(tiny_model_path), str(tiny_draft_path), 256, "auto", None, None, "t")
    full = gpu_plan(tiny_model_path, tiny_draft_path, 1 * GiB)
    assert full.fits
    load_engine(namespace(), choice, plan=full)
    assert loads[-1]["n_gpu_layers"] == full.target.n_gpu_layers == full.target.n_layer + 1
    assert loads[-1]["n_gpu_layers_draft"] == full.draft.n_gpu_layers
    assert loads[-1]["n_ctx"] == 256 and loads[-1]["draft"] == str(tiny_draft_path)

    # A budget with room for the draft and some of the target: a partial offload.
    need = full.draft.device_bytes + full.target.compute + full.target.weights_device // 2
    partial = gpu_plan(tiny_model_path, tiny_draft_path, need)
    assert partial.fits and 0 <= partial.target.n_gpu_layers < full.target.n_gpu_layers
    load_engine(namespace(), choice, plan=partial)
    assert loads[-1]["n_gpu_layers"] == partial.target.n_gpu_layers
    assert "GPU GPU0: target " in plan_summary(partial)

    load_engine(namespace(n_gpu_layers=2), choice, plan=partial)  # the option wins
    assert loads[-1]["n_gpu_layers"] == 2 and loads[-1]["n_gpu_layers_draft"] is None


def test_refusal_and_explicit_override_on_a_gpu(tiny_model_path: Path, tiny_draft_path: Path,
                                                loads: list[dict[str, Any]]) -> None:
    choice = ModelChoice(str(tiny_model_path), str(tiny_draft_path), 256, "auto", None, None, "t")
    tiny = gpu_plan(tiny_model_path, tiny_draft_path, 1024)
    assert not tiny.fits and tiny.reason
    with pytest.raises(ModelLoadError, match="draft model alone needs"):
        load_engine(namespace(), choice, plan=tiny)
    assert loads == []
    load_engine(namespace(n_gpu_layers=0), choice, plan=tiny)  # the user placed it: no plan
    assert loads[-1]["n_gpu_layers"] == 0


def test_plan_for_ngram_and_cpu_layers(tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       loads: list[dict[str, Any]]) -> None:
    monkeypatch.setattr("localspec.planning.devices.ggml_devices", list)  # a machine without a GPU
    plan = plan_for(tiny_model_path, "ngram", 512)
    assert plan.draft is None and plan.fits and plan.device.kind == "cpu"
    choice = ModelChoice(str(tiny_model_path), "ngram", 512, "auto", None, None, "t")
    load_engine(namespace(budget="64GiB"), choice)
    assert loads[-1]["n_gpu_layers"] == 0 and loads[-1]["n_gpu_layers_draft"] is None
    assert plan_summary(plan).startswith("CPU RAM: ") and "draft" not in plan_summary(plan)
