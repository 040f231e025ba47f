"""`localspec check` as a user runs it: vocabulary report, then a short real measurement."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from localspec import _core
from localspec.bench.prompts import BUILTIN_CATEGORIES
from tests.fixtures.helpers import run_localspec as localspec


def check(target: Path, draft: Path | str, *extra: str) -> subprocess.CompletedProcess[str]:
    return localspec("check", "--target", str(target), "--draft", str(draft), *extra)


def test_compatible_pair_reports_acceptance_and_speedup(tiny_model_path: Path,
                                                        tiny_draft_path: Path) -> None:
    proc = check(tiny_model_path, tiny_draft_path, "--max-tokens", "24")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for fragment in ("Vocabulary", "BPE", "first differing token: none", "verdict: compatible",
                     "acceptance rate", "mean accepted length", "tokens/s", "measured speedup",
                     "identical to plain     yes", "Will this draft help?"):
        assert fragment in out, fragment
    assert re.search(r"^Memory: (CPU RAM|GPU)", out, re.M)  # GPU builds place the layers there
    assert re.search(r"measured speedup\s+\d+\.\d\dx", out)
    assert f"{len(BUILTIN_CATEGORIES)} prompt(s), 24 tokens each" in out


def test_json_fields(tiny_model_path: Path, tiny_draft_path: Path) -> None:
    proc = check(tiny_model_path, tiny_draft_path, "--max-tokens", "16", "--categories",
                 "qa,code", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    vocab = data["vocabulary"]
    assert vocab["compatible"] and vocab["first_difference"] == -1 and vocab["problem"] == ""
    assert vocab["target"] == vocab["draft"]
    assert vocab["target"]["type_name"] == "BPE" and vocab["target"]["n_tokens"] > 0
    m = data["measurement"]
    assert m["n_prompts"] == 2 and m["max_tokens"] == 16 and m["draft_max"] == "auto"
    assert m["identical"] in ("yes", "tie")
    assert m["plain_tps"] > 0 and m["speculative_tps"] > 0
    assert m["speedup"] == m["speculative_tps"] / m["plain_tps"]
    assert 0 <= m["acceptance_rate"] <= 1 and m["mean_accepted_length"] >= 1
    assert m["accepted"] <= m["drafted"] and isinstance(m["helps"], bool)
    assert [c["label"] for c in m["categories"]] == ["qa", "code"]
    assert data["memory"].startswith("CPU RAM: ") or data["memory"].startswith("GPU ")
    assert data["verify_head"] == data["draft_head"] == "llama.cpp"  # tiny models: F32 heads
    assert data["saved_stats_used"] is False  # check starts the controller from nothing


def test_without_a_terminal_progress_goes_to_stderr_and_other_drafters_are_tried(
        tiny_model_path: Path, tiny_draft_path: Path) -> None:
    """A check in a log or CI is never silent; --compare-drafters measures ngram and
    hybrid:MODEL on the first prompts (as check does by itself when the draft does not pay)."""
    proc = check(tiny_model_path, tiny_draft_path, "--max-tokens", "8", "--categories",
                 "qa,code", "--json", "--compare-drafters")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("check: 2 prompt(s) x 1 repeat(s) x 8 tokens x 3 arms")
    assert lines[1].startswith("check: 1/2 prompts") and "left" in lines[1]
    assert lines[2].startswith("check: 2/2 prompts")
    assert "check: trying --draft ngram on 2 prompt(s), 8 tokens" in lines
    data = json.loads(proc.stdout)
    assert [a["drafter"] for a in data["alternatives"]] == ["ngram", f"hybrid:{tiny_draft_path}"]
    assert all(a["speedup"] > 0 for a in data["alternatives"])
    m = data["measurement"]
    assert isinstance(m["controller_declined"], bool) and m["draft_token_seconds"] > 0
    assert any(w.startswith("a drafted token costs") for w in data["why"])


def test_llama_head_flag_picks_the_target_head(q8_head_model: Path) -> None:
    heads = {}
    for extra in ((), ("--llama-head",)):
        # On the CPU: localspec's heads are CPU kernels (a GPU build gives llama.cpp the head)
        proc = check(q8_head_model, "ngram", "--max-tokens", "8", "--categories", "qa", "--json",
                     "--n-gpu-layers", "0", *extra)
        assert proc.returncode == 0, proc.stderr
        heads[extra] = json.loads(proc.stdout)["verify_head"]
    assert heads[("--llama-head",)] == "llama.cpp"
    assert heads[()] == ("localspec-q8_0" if _core.q8_head_supported() else "llama.cpp")


def test_mismatched_pair_exits_2_naming_the_token(tiny_model_path: Path,
                                                  other_vocab_model_path: Path) -> None:
    expected = _core.compare_vocab(str(tiny_model_path), str(other_vocab_model_path))
    first = expected["first_difference"]
    assert first >= 0
    proc = check(tiny_model_path, other_vocab_model_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot draft" in lines[0]
    assert f"token {first} is '{expected['target_text']}' in the target but " \
           f"'{expected['draft_text']}' in the draft" in lines[0]
    assert f"first differing token: {first}" in proc.stdout and "INCOMPATIBLE" in proc.stdout
    assert "acceptance rate" not in proc.stdout  # nothing was measured


def test_mismatched_pair_json(tiny_model_path: Path, other_vocab_model_path: Path) -> None:
    proc = check(tiny_model_path, other_vocab_model_path, "--json")
    assert proc.returncode == 2
    data = json.loads(proc.stdout)
    assert not data["vocabulary"]["compatible"] and data["measurement"] is None
    assert data["vocabulary"]["first_difference"] >= 0


def test_vocab_only_and_ngram(tiny_model_path: Path, tiny_draft_path: Path) -> None:
    proc = check(tiny_model_path, tiny_draft_path, "--vocab-only")
    assert proc.returncode == 0 and "verdict: compatible" in proc.stdout
    assert "Measurement" not in proc.stdout
    proc = check(tiny_model_path, "ngram", "--max-tokens", "16", "--limit", "1", "--categories",
                 "code", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["vocabulary"] is None and data["measurement"]["identical"] in ("yes", "tie")


def test_user_errors(tmp_path: Path, tiny_model_path: Path) -> None:
    cases = [
        (check(tiny_model_path, "none"), "no drafter"),
        (check(tiny_model_path, tmp_path / "missing.gguf"), "does not exist"),
        (check(tiny_model_path, tiny_model_path, "--limit", "0"), "--limit"),
        (check(tiny_model_path, tiny_model_path, "--max-tokens", "0"), "max_tokens"),
    ]
    for proc, fragment in cases:
        assert proc.returncode == 2, (fragment, proc.stderr)
        assert fragment in proc.stderr and "Traceback" not in proc.stderr
