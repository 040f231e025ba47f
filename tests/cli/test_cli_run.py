"""`localspec run` as a user runs it: a real subprocess, real models, exit codes, JSON schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.helpers import run_localspec as localspec


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


# ---- chat mode, what produced the output, limits, Ctrl+C ---------------------------------


def test_chat_mode_renders_the_chat_template(tiny_model_path: Path) -> None:
    from localspec.runtime.engine import Engine
    from localspec.text.chat_template import chat_tokens

    args = ["Say hi", "--target", str(tiny_model_path), "--temperature", "0",
            "--max-tokens", "12", "--draft", "ngram", "--threads", "1"]
    chat = run_json(*args, "--chat", "--system", "Be brief.")
    plain = run_json(*args)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
    with Engine.load(tiny_model_path, draft="none", n_ctx=512, n_threads=1) as engine:
        tokens = chat_tokens(engine.info.chat_template or "", messages, engine.info,
                             engine.tokenize)
        expected = engine.generate(tokens, temperature=0.0, max_tokens=12, speculative=False)
        assert "user\nSay hi\nassistant" in engine.detokenize(tokens)  # ChatML, specials dropped
    assert chat["stats"]["prompt_tokens"] == len(tokens) != plain["stats"]["prompt_tokens"]
    assert chat["tokens"] == expected.tokens


def test_system_needs_chat(tiny_model_path: Path) -> None:
    proc = localspec("run", "hi", "--target", str(tiny_model_path), "--system", "Be brief.")
    expect_user_error(proc, "--system only applies to chat mode: add --chat")


def test_json_names_models_seed_and_sampling(tiny_model_path: Path) -> None:
    args = ["once upon a time", "--target", str(tiny_model_path), "--draft", "ngram",
            "--temperature", "0.9", "--top-k", "20", "--max-tokens", "16", "--threads", "1"]
    first = run_json(*args)
    assert first["target"] == str(tiny_model_path) and first["drafter"] == "ngram"
    assert first["pair"] is None
    params = first["params"]
    assert params["temperature"] == 0.9 and params["top_k"] == 20 and params["max_tokens"] == 16
    assert isinstance(params["seed"], int)  # drawn at random, reported so it can be replayed
    again = run_json(*args, "--seed", str(params["seed"]))
    assert again["params"]["seed"] == params["seed"] and again["tokens"] == first["tokens"]


def test_context_raised_and_gpu_layers_on_a_cpu_build_are_said(tiny_model_path: Path) -> None:
    from localspec.commands.limits import has_gpu_backend

    proc = localspec("run", "hi", "--target", str(tiny_model_path), "--max-tokens", "4",
                     "--ctx", "100", "--n-gpu-layers", "8", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert "note: the context was raised from 100 to 256 tokens" in proc.stderr
    gpu_note = "note: --n-gpu-layers 8 has no effect: this llama.cpp build runs on the CPU only"
    assert (gpu_note in proc.stderr) == (not has_gpu_backend())
    quiet = localspec("run", "hi", "--target", str(tiny_model_path), "--max-tokens", "4",
                      "--ctx", "512", "--threads", "1")
    assert "note:" not in quiet.stderr


def test_ctrl_c_ends_the_line_and_prints_the_stats(tiny_model_path: Path) -> None:
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "localspec.cli", "run", "once upon a time", "--target",
         str(tiny_model_path), "--ignore-eos", "--max-tokens", "100000", "--ctx", "65536",
         "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    proc.stdout.read(20)  # the text is streaming
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and out.endswith("\n")
    summary = err.strip().splitlines()[-1]
    assert summary.startswith("[") and summary.endswith("(interrupted)")
    n_tokens = int(summary[1:].split()[0])
    assert 0 < n_tokens < 100000


def test_version() -> None:
    from localspec import __version__

    proc = localspec("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"localspec {__version__} (llama-cpp-python 0.3.36)"


def test_runs_in_the_suite_save_statistics_in_its_own_cache(tiny_model_path: Path,
                                                            private_cache: Path) -> None:
    """`localspec run` saves what the controller learned into the cache directory: in the
    suite that is the session's own (tests/conftest.py), never the user's. The file is named by
    the models' identity, and this session's tiny model exists nowhere else, so no other
    process on the machine can write a file of that name."""
    import platformdirs

    users = Path(platformdirs.user_cache_dir("localspec"))
    saved = private_cache / "controller"
    before = set(saved.glob("*.json")) if saved.is_dir() else set()
    # a context size no other test uses: the file's key is this run's alone
    run_json("the quick brown fox", "--target", str(tiny_model_path), "--draft", "ngram",
             "--temperature", "0", "--max-tokens", "8", "--threads", "1", "--ctx", "1792")
    new = set(saved.glob("*.json")) - before
    assert len(new) == 1  # the run's statistics, in the session's cache
    assert not (users / "controller" / new.pop().name).exists()
