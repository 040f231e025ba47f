"""`localspec bench`: its arithmetic on hand-made numbers, the speed-limit formula, and the
command end to end on tiny models (structure and correctness only, never a wall-clock time)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from localspec.bench.baseline import summarize_baseline
from localspec.bench.llamacpp_baseline import count_accepted
from localspec.bench.lossless import Divergence
from localspec.bench.prompts import Prompt
from localspec.bench.report import summarize
from localspec.bench.runner import PromptRun
from localspec.bench.theory import (
    estimate_costs,
    expected_tokens,
    per_token_acceptance,
    rejection_events,
    theoretical_speedup,
)
from localspec.types import GenerationStats
from tests.fixtures.helpers import run_bench as bench

# ---- hand-made statistics --------------------------------------------------------------


def stats(n_tokens: int, seconds: float, steps: Sequence[tuple[int, int]] = (),
          draft_s: float = 0.0, verify_s: float = 0.0) -> GenerationStats:
    """Statistics as the core records them: `steps` are (drafted, accepted) per target pass;
    without steps, a plain run of n_tokens passes."""
    s = GenerationStats(n_tokens=n_tokens, generation_seconds=seconds,
                        tokens_per_second=n_tokens / seconds, draft_seconds=draft_s,
                        verify_seconds=verify_s)
    for drafted, accepted in steps or [(0, 0)] * n_tokens:
        s.target_passes += 1
        s.drafted += drafted
        s.accepted += accepted
        s.rejected += drafted - accepted
        hist = s.accepted_length_histogram
        hist.extend([0] * (accepted + 1 - len(hist)))
        hist[accepted] += 1
        for positions in (s.drafted_by_position, s.accepted_by_position):
            positions.extend([0] * (drafted - len(positions)))
        for i in range(drafted):
            s.drafted_by_position[i] += 1
            s.accepted_by_position[i] += i < accepted
    s.acceptance_rate = s.accepted / s.drafted if s.drafted else 0.0
    return s


def prompt_run(pid: str, category: str, plain: GenerationStats, spec: GenerationStats,
               verdicts: Sequence[str] = ()) -> PromptRun:
    divergences = [Divergence(3, 1, 2, 0.1, -1 if v == "tie" else 3, v) for v in verdicts]  # type: ignore[arg-type]
    return PromptRun(Prompt(pid, category, "text"), [plain], [spec], identical=not verdicts,
                     divergences=divergences)


# ---- report arithmetic -----------------------------------------------------------------


def test_summarize_rows_speedup_and_aggregates() -> None:
    # a1: plain 10 tokens in 1 s, speculative 10 tokens in 0.5 s over 4 passes.
    a1 = prompt_run("a1", "A", stats(10, 1.0),
                    stats(10, 0.5, [(3, 3), (3, 1), (3, 0), (3, 2)], draft_s=0.1, verify_s=0.3))
    # a2: plain 10 tokens in 3 s, speculative 10 tokens in 2 s over 10 passes drafting nothing.
    a2 = prompt_run("a2", "A", stats(10, 3.0), stats(10, 2.0, [(0, 0)] * 10))
    b1 = prompt_run("b1", "B", stats(20, 2.0), stats(20, 1.0, [(4, 4)] * 4))
    report = summarize([a1, a2, b1])

    first = report.prompts[0]
    assert (first.plain_tps, first.speculative_tps, first.speedup) == (10.0, 20.0, 2.0)
    assert (first.drafted, first.accepted, first.rejected) == (12, 6, 6)
    assert first.acceptance_rate == 0.5 and first.mean_accepted_length == 2.5

    a, b = report.categories
    assert a.label == "A" and a.n_runs == 2
    assert a.plain_tps == pytest.approx(20 / 4.0)  # total tokens / total time, not a mean
    assert a.speculative_tps == pytest.approx(20 / 2.5)
    assert a.speedup == pytest.approx(8.0 / 5.0)
    assert a.mean_accepted_length == pytest.approx(20 / 14)
    assert a.draft_seconds == pytest.approx(0.1) and a.verify_seconds == pytest.approx(0.3)
    assert b.speedup == pytest.approx(2.0) and b.acceptance_rate == 1.0
    assert report.overall.plain_tps == pytest.approx(40 / 6.0)
    assert report.overall.speculative_tps == pytest.approx(40 / 3.5)
    # passes accepting 0..4 drafts: a1 (3, 1, 0, 2), a2 ten zeros, b1 four full drafts of 4
    assert report.accepted_length_histogram == [11, 1, 1, 1, 4]
    assert json.loads(json.dumps(report.to_dict()))["overall"]["label"] == "all"


def test_repeats_are_paired_and_the_aa_arm_measures_the_noise() -> None:
    """Three repeats; repeat r of each arm is compared with repeat r of plain. The A/A arm is a
    second plain arm: its ratio and spread say whether a 2% difference could be seen."""
    def run(pid: str, category: str, plain_s: Sequence[float], spec_s: Sequence[float],
            again_s: Sequence[float]) -> PromptRun:
        return PromptRun(Prompt(pid, category, "text"), [stats(10, t) for t in plain_s],
                         [stats(10, t) for t in spec_s], [stats(10, t) for t in again_s])

    steady = run("steady", "A", [1.0, 1.0, 1.0], [0.5, 0.5, 0.5], [1.0, 1.0, 1.0])
    noisy = run("noisy", "B", [1.0, 1.0, 1.0], [1.0, 1.25, 0.8], [1.0, 0.9, 1.1])
    report = summarize([steady, noisy])
    a, b = report.prompts
    assert (a.speedup, a.speedup_spread, a.aa, a.aa_spread) == (2.0, 0.0, 1.0, 0.0)
    assert a.trusted
    assert b.speedup == pytest.approx(1.0)  # the median of 1.0, 0.8 and 1.25
    assert b.speedup_spread == pytest.approx((1.25 - 0.8) / 2)
    assert b.aa_spread == pytest.approx((1 / 0.9 - 1 / 1.1) / 2)
    assert not b.trusted
    assert report.worst is not None
    assert (report.worst.prompt, report.worst.category) == ("noisy", "B")
    assert report.worst.prompt_speedup == pytest.approx(1.0)
    rows = report.to_dict()["prompts"]
    assert [row["trusted"] for row in rows] == [True, False]


def test_verdicts_yes_tie_no() -> None:
    plain, spec = stats(4, 1.0), stats(4, 1.0, [(1, 1), (1, 1)])
    same = prompt_run("s", "A", plain, spec)
    tie = prompt_run("t", "A", plain, spec, verdicts=["tie"])
    real = prompt_run("n", "B", plain, spec, verdicts=["tie", "NO"])
    assert [r.verdict for r in (same, tie, real)] == ["yes", "tie", "NO"]
    report = summarize([same, tie, real])
    assert [row.identical for row in report.prompts] == ["yes", "tie", "NO"]
    assert [row.identical for row in report.categories] == ["tie", "NO"]
    assert report.overall.identical == "NO"
    assert summarize([same, tie]).overall.identical == "tie"


# ---- the speed limit -------------------------------------------------------------------


def test_expected_tokens_and_speedup_by_hand() -> None:
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(0.8, 4) == pytest.approx(1 + 0.8 + 0.64 + 0.512 + 0.4096)
    assert expected_tokens(0.0, 5) == 1.0 and expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.3, 0) == 1.0
    assert theoretical_speedup(0.5, 2, 0.1, 1.5) == pytest.approx(1.75 / 1.7)
    assert theoretical_speedup(1.0, 4, 0.0, 1.0) == 5.0
    assert theoretical_speedup(0.0, 0, 0.5, 1.0) == 1.0  # k = 0 is plain decoding
    with pytest.raises(ValueError):
        expected_tokens(1.5, 2)
    with pytest.raises(ValueError):
        theoretical_speedup(0.5, 0, 0.1, 0.0)


def test_rejection_events_and_per_token_acceptance() -> None:
    # k = 4: one full acceptance, rejections at positions 1, 0 and 3.
    s = stats(10, 1.0, [(4, 4), (4, 1), (4, 0), (4, 3)])
    assert rejection_events(s) == 3
    assert per_token_acceptance([s]) == pytest.approx(8 / (8 + 3))
    # A shortened last draft that was fully accepted is not a rejection.
    assert rejection_events(stats(6, 1.0, [(4, 4), (1, 1)])) == 0
    assert rejection_events(stats(2, 1.0, [(0, 0), (0, 0)])) == 0
    assert per_token_acceptance([stats(2, 1.0, [(0, 0), (0, 0)])]) == 0.0


def test_estimate_costs_by_hand() -> None:
    # Plain: 100 passes whose verification (decode + argmax) took 1.0 s -> 10 ms per pass.
    plain = stats(100, 1.25, verify_s=1.0)
    # Speculative, k = 4: 4 passes, 16 drafted in 0.08 s (5 ms each = 0.5 passes),
    # verification 0.06 s per pass (6 passes' worth), 8 accepted, 3 rejections.
    spec = stats(12, 0.5, [(4, 4), (4, 1), (4, 0), (4, 3)], draft_s=0.08, verify_s=0.24)
    costs = estimate_costs([plain], [spec])
    a = 8 / 11
    assert costs.k == 4
    assert costs.a == pytest.approx(a)
    assert costs.acceptance_rate == pytest.approx(0.5)
    assert costs.tau == pytest.approx(3.0)
    assert costs.c == pytest.approx(0.5) and costs.v == pytest.approx(6.0)
    e = (1 - a**5) / (1 - a)
    assert costs.expected_tokens == pytest.approx(e)
    assert costs.theoretical_speedup == pytest.approx(e / (4 * 0.5 + 6.0))
    assert costs.measured_speedup == pytest.approx((12 / 0.5) / (100 / 1.25))
    assert costs.efficiency == pytest.approx(costs.measured_speedup / costs.theoretical_speedup)


# ---- the llama-cpp-python baseline's arithmetic ----------------------------------------


def test_count_accepted_against_the_generated_sequence() -> None:
    sequence = [1, 2, 3, 4, 5, 6]
    drafts = [(2, [3, 4, 9]), (4, [5, 7]), (5, [6, 8, 8])]  # last one runs past the end
    assert count_accepted(drafts, sequence) == (3 + 2 + 1, 2 + 1 + 1)


def test_summarize_baseline_ratios() -> None:
    runs = [prompt_run("a1", "A", stats(10, 1.0), stats(10, 0.5, [(1, 1)] * 5))]
    runs[0].plain_tokens = [7, 8, 9]
    report = summarize(runs)

    def child(arm: str, seconds: float, drafted: int = 0, accepted: int = 0) -> dict:
        return {"id": "a1", "category": "A", "arm": arm, "repeat": 0, "n_tokens": 11,
                "generation_seconds": seconds, "drafted": drafted, "accepted": accepted,
                "tokens": [7, 8, 9]}

    result = {"llama_cpp_version": "0.3.36", "num_pred_tokens": 2, "max_ngram_size": 2,
              "runs": [child("plain", 2.0), child("prompt-lookup", 4.0, 6, 3)]}
    baseline = summarize_baseline(result, report, runs)
    row = baseline.categories[0]
    assert row.llamacpp_plain_tps == pytest.approx(10 / 2.0)  # tokens after the first
    assert row.llamacpp_lookup_tps == pytest.approx(10 / 4.0)
    assert row.lookup_acceptance_rate == pytest.approx(0.5)
    assert row.plain_vs_plain == pytest.approx(10.0 / 5.0)
    assert row.speculative_vs_lookup == pytest.approx(20.0 / 2.5)
    assert (row.plain_outputs_same, row.n_prompts) == (1, 1) and baseline.overall is not None
    assert baseline.best_tps() == {"A": pytest.approx(5.0), "all": pytest.approx(5.0)}
    failed = summarize_baseline({"error": "boom"}, report, runs)
    assert failed.error == "boom" and failed.best_tps() == {}


def test_a_cpu_build_with_the_rpc_backend_is_not_taken_for_a_gpu() -> None:
    """The baseline's prompt lookup drafts 2 tokens on a CPU and 10 with a GPU; the tests'
    llama-cpp-python has the RPC backend, for which llama_supports_gpu_offload() says yes."""
    lib = Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib"  # type: ignore[union-attr, arg-type]
    if any(f.name.startswith(("libggml-cuda", "libggml-metal", "libggml-vulkan", "libggml-hip",
                              "libggml-sycl")) for f in lib.iterdir()):
        pytest.skip("this llama-cpp-python has a GPU backend")
    code = ("import llama_cpp; from localspec.bench.llamacpp_baseline import has_gpu; "
            "print(has_gpu(llama_cpp), llama_cpp.llama_supports_gpu_offload())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)  # llama_cpp never shares a process with _core
    gpu, offload = done.stdout.split()
    assert gpu == "False"
    if (lib / "libggml-rpc.so").exists():
        assert offload == "True"  # what the old check read as a GPU


# ---- the command, end to end -----------------------------------------------------------


ROW_FIELDS = {"label", "n_runs", "plain_tps", "speculative_tps", "speedup", "speedup_spread",
              "aa", "aa_spread", "trusted", "drafted", "accepted", "rejected", "acceptance_rate",
              "mean_accepted_length", "draft_seconds", "verify_seconds", "other_seconds",
              "identical", "forced_drafted", "forced_accepted", "candidate_rows", "valid"}


def test_bench_json_and_plot(tiny_model_path: Path, tiny_draft_path: Path, prompt_file: Path,
                             tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    proc = bench("--target", str(tiny_model_path), "--draft", str(tiny_draft_path),
                 "--prompts", str(prompt_file), "--max-tokens", "12", "--draft-max", "3",
                 "--repeat", "2", "--json", "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert {"target", "drafter", "max_tokens", "temperature", "draft_max", "repeat", "prompts",
            "categories", "overall", "accepted_length_histogram"} <= set(out)
    assert out["verify_head"] == out["draft_head"] == "llama.cpp"  # the tiny models: F32 heads
    assert [p["label"] for p in out["prompts"]] == ["fox", "81"]
    assert [c["label"] for c in out["categories"]] == ["summarization", "conversation"]
    for row in out["prompts"] + out["categories"] + [out["overall"]]:
        assert set(row) == ROW_FIELDS
        assert row["n_runs"] == (2 if row in out["prompts"] else row["n_runs"])
        assert row["identical"] in ("yes", "tie")
        assert row["drafted"] == row["accepted"] + row["rejected"]
    assert out["overall"]["n_runs"] == 4
    assert out["overall"]["aa"] > 0  # the A/A arm ran
    assert out["worst"]["category"] in ("summarization", "conversation")
    assert out["saved_stats_used"] is False
    assert sum(out["accepted_length_histogram"]) > 0
    assert png.read_bytes().startswith(b"\x89PNG")


def test_bench_table(tiny_model_path: Path, prompt_file: Path) -> None:
    proc = bench("--target", str(tiny_model_path), "--draft", "ngram", "--prompts",
                 str(prompt_file), "--max-tokens", "8", "--per-prompt")
    assert proc.returncode == 0, proc.stderr
    for text in ("per prompt", "per category", "speedup", "accept %", "summarization", "81"):
        assert text in proc.stdout


def test_bench_synthetic_prints_the_speed_limit(prompt_file: Path) -> None:
    small = ["--synthetic", "--synthetic-embd", "64", "--synthetic-layers", "1",
             "--extra-layers", "1", "--prompts", str(prompt_file), "--max-tokens", "16"]
    proc = bench(*small)
    assert proc.returncode == 0, proc.stderr
    for text in ("S theory", "S measured", "measured / theory", "v(k+1)", "a (per token)"):
        assert text in proc.stdout
    proc = bench(*small, "--json", "--draft-max", "3")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["draft_max"] == 3 and out["synthetic"]["n_embd"] == 64
    theory = {row["label"]: row for row in out["theory"]}
    assert set(theory) == {"summarization", "conversation", "all"}
    row = theory["all"]
    assert row["k"] == 3 and 0.0 <= row["a"] <= 1.0 and row["c"] > 0 and row["v"] > 0
    assert row["expected_tokens"] == pytest.approx(expected_tokens(row["a"], 3))
    assert row["theoretical_speedup"] == pytest.approx(
        theoretical_speedup(row["a"], 3, row["c"], row["v"]))
    assert out["overall"]["identical"] in ("yes", "tie")


@pytest.mark.parametrize("extra", [["--draft-max", "auto"], ["--draft-max", "0"],
                                   ["--target", "x.gguf"], ["--synthetic-embd", "100"]])
def test_bench_synthetic_user_errors(extra: list[str]) -> None:
    proc = bench("--synthetic", *extra)
    assert proc.returncode == 2
    assert proc.stderr.startswith("localspec: error:") and len(proc.stderr.splitlines()) == 1


def test_baseline_llama_cpp_python(tiny_model_path: Path, prompt_file: Path) -> None:
    pytest.importorskip("llama_cpp")  # only to know it is installed; the bench runs it apart
    proc = bench("--target", str(tiny_model_path), "--draft", "ngram", "--prompts",
                 str(prompt_file), "--max-tokens", "16", "--baseline", "llama-cpp-python",
                 "--json")
    assert proc.returncode == 0, proc.stderr
    baseline = json.loads(proc.stdout)["baseline"]
    assert baseline["error"] is None and baseline["llama_cpp_version"]
    # The child reports each run as it ends: 2 prompts x 3 repeats x 2 arms.
    assert "baseline llama-cpp-python: 12/12 runs" in proc.stderr
    rows = baseline["categories"] + [baseline["overall"]]
    assert [r["label"] for r in rows] == ["summarization", "conversation", "all"]
    for row in rows:
        assert row["llamacpp_plain_tps"] > 0 and row["llamacpp_lookup_tps"] > 0
        assert row["speculative_vs_lookup"] > 0
        assert row["lookup_accepted"] <= row["lookup_drafted"]
        # The same model, prompt tokens and greedy decoding: llama-cpp-python's plain output
        # is localspec's plain output.
        assert row["plain_outputs_same"] == row["n_prompts"] >= 1
    table = bench("--target", str(tiny_model_path), "--draft", "ngram", "--prompts",
                  str(prompt_file), "--max-tokens", "8", "--baseline", "llama-cpp-python")
    assert table.returncode == 0, table.stderr
    text = " ".join(table.stdout.split())
    assert "spec vs lookup" in text and "2/2" in text
    assert "localspec n-gram vs llama-cpp-python prompt lookup" in text


def test_baseline_needs_greedy(tiny_model_path: Path) -> None:
    proc = bench("--target", str(tiny_model_path), "--baseline", "llama-cpp-python",
                 "--temperature", "0.7")
    assert proc.returncode == 2 and "use --temperature 0" in proc.stderr


def test_baseline_failure_is_one_sentence(tiny_model_path: Path, prompt_file: Path,
                                          tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "llama_cpp.py").write_text("raise ImportError('no llama here')\n")
    import os

    env = {**os.environ, "PYTHONPATH": str(fake)}
    proc = bench("--target", str(tiny_model_path), "--draft", "ngram", "--prompts",
                 str(prompt_file), "--max-tokens", "8", "--baseline", "llama-cpp-python",
                 env=env)
    assert proc.returncode == 0, proc.stderr
    assert "llama-cpp-python baseline skipped: llama-cpp-python is not importable" in (
        " ".join(proc.stdout.split()))


def test_bench_chat_renders_each_prompt_as_a_user_turn(tiny_model_path: Path,
                                                       prompt_file: Path) -> None:
    """--chat: each prompt goes through the chat template (ChatML here), so it is the raw
    prompt plus the template's markers; both arms see the same tokens."""
    common = ("--target", str(tiny_model_path), "--draft", "ngram", "--prompts",
              str(prompt_file), "--max-tokens", "4", "--repeat", "1", "--json")
    raw = json.loads(bench(*common).stdout)
    proc = bench(*common, "--chat")
    assert proc.returncode == 0, proc.stderr
    chat = json.loads(proc.stdout)
    assert (raw["chat"], chat["chat"]) == (False, True)
    for pid, n in raw["prompt_tokens"].items():
        assert chat["prompt_tokens"][pid] > n + 4  # <|im_start|>user\n ... <|im_end|> ...
    assert chat["overall"]["identical"] in ("yes", "tie")
    proc = bench("--chat", "--synthetic", "--prompts", str(prompt_file))
    assert proc.returncode == 2 and "--chat" in proc.stderr
