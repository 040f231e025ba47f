"""`localspec run` as a user runs it: a real subprocess, real models, exit codes, JSON schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def localspec(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "localspec.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_json(*args: str, stdin: str | None = None) -> dict:
    proc = localspec("run", *args, "--json", stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_json_schema_and_lossless_greedy(tiny_model_path: Path, tiny_draft_path: Path) -> None:
    common = [
        "the quick brown fox",
        "--target",
        str(tiny_model_path),
        "--temperature",
        "0",
        "--max-tokens",
        "32",
    ]
    plain = run_json(*common, "--draft", "none")
    for drafter in (str(tiny_draft_path), "ngram", str(tiny_model_path)):
        out = run_json(*common, "--draft", drafter, "--draft-max", "4")
        assert set(out) >= {"text", "tokens", "provenance", "stats", "finish_reason"}
        assert set(out["stats"]) >= {
            "drafted",
            "accepted",
            "acceptance_rate",
            "mean_accepted_length",
            "target_passes",
            "n_tokens",
            "tokens_per_second",
        }
        assert set(out["provenance"]) <= {"draft", "target"}
        assert len(out["provenance"]) == len(out["tokens"]) == out["stats"]["n_tokens"]
        assert out["text"] == plain["text"] and out["tokens"] == plain["tokens"]
    self_draft = run_json(*common, "--draft", str(tiny_model_path), "--draft-max", "4")
    assert self_draft["stats"]["acceptance_rate"] >= 0.98


def test_prompt_from_stdin(tiny_model_path: Path) -> None:
    args = ["--target", str(tiny_model_path), "--temperature", "0", "--max-tokens", "8"]
    assert (
        run_json("-", *args, stdin="hello world")["tokens"]
        == run_json("hello world", *args)["tokens"]
    )


def test_streaming_output_prints_text_and_stats(tiny_model_path: Path) -> None:
    proc = localspec(
        "run", "hello", "--target", str(tiny_model_path), "--temperature", "0", "--max-tokens", "8"
    )
    assert proc.returncode == 0, proc.stderr
    assert "8 tokens" in proc.stderr and "accepted" in proc.stderr


def expect_user_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr


def test_missing_file(tmp_path: Path) -> None:
    expect_user_error(
        localspec("run", "hi", "--target", str(tmp_path / "nope.gguf")), "does not exist"
    )


def test_not_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_text("this is not a model")
    expect_user_error(localspec("run", "hi", "--target", str(bad)), "not a GGUF file")


def test_truncated_gguf(tmp_path: Path, tiny_model_path: Path) -> None:
    data = tiny_model_path.read_bytes()
    for cut in (len(data) // 2, 2000):
        trunc = tmp_path / f"trunc{cut}.gguf"
        trunc.write_bytes(data[:cut])
        expect_user_error(localspec("run", "hi", "--target", str(trunc)), "truncated")


def test_truncated_draft(tmp_path: Path, tiny_model_path: Path, tiny_draft_path: Path) -> None:
    trunc = tmp_path / "draft.gguf"
    trunc.write_bytes(tiny_draft_path.read_bytes()[:5000])
    expect_user_error(
        localspec("run", "hi", "--target", str(tiny_model_path), "--draft", str(trunc)), "truncated"
    )


def test_vocabulary_mismatch_names_first_differing_token(
    tiny_model_path: Path, other_vocab_model_path: Path
) -> None:
    proc = localspec(
        "run", "hi", "--target", str(tiny_model_path), "--draft", str(other_vocab_model_path)
    )
    expect_user_error(proc, "cannot draft", "token ")
    # The message names an id and both texts.
    assert "in the target but" in proc.stderr and "in the draft" in proc.stderr


def test_prompt_longer_than_context(tiny_model_path: Path) -> None:
    proc = localspec("run", "word " * 400, "--target", str(tiny_model_path), "--ctx", "128")
    expect_user_error(proc, "tokens but the context holds only")


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "0"], "top_p"),
        (["--max-tokens", "0"], "max_tokens"),
        (["--min-p", "2"], "min_p"),
        (["--top-k", "-3"], "top_k"),
        (["--ctx", "4"], "n_ctx"),
        (["--draft-max", "abc"], "draft-max"),
        (["--draft-max", "99"], "draft-max"),
    ],
)
def test_invalid_parameters(tiny_model_path: Path, args: list[str], fragment: str) -> None:
    expect_user_error(localspec("run", "hi", "--target", str(tiny_model_path), *args), fragment)
