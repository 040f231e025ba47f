"""`localspec run --prediction FILE`: a real subprocess; the output is the same with a
prediction, `--json` reports its tokens under OpenAI's names, and a bad file is one sentence."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fixtures.helpers import run_localspec as localspec


def run_json(*args: str, stdin: str | None = None) -> dict:
    proc = localspec("run", *args, "--json", stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_prediction_file_keeps_the_output(tiny_model_path: Path, tmp_path: Path) -> None:
    common = ["the quick brown fox", "--target", str(tiny_model_path), "--temperature", "0",
              "--max-tokens", "32", "--ignore-eos", "--draft-max", "4", "--reset-stats"]
    plain = run_json(*common)
    assert "prediction" not in plain
    path = tmp_path / "prediction.txt"
    path.write_text(plain["text"], encoding="utf-8")
    predicted = run_json(*common, "--prediction", str(path))
    assert predicted["tokens"] == plain["tokens"]
    counts = predicted["prediction"]
    stats = predicted["stats"]
    assert counts["accepted_prediction_tokens"] == stats["accepted_by_kind"]["prediction"]
    assert (counts["accepted_prediction_tokens"] + counts["rejected_prediction_tokens"]
            == stats["drafted_by_kind"]["prediction"] > 0)
    assert "prediction" not in predicted["params"]  # the text is not echoed back
    from_stdin = run_json(*common, "--prediction", "-", stdin=plain["text"])
    assert from_stdin["prediction"] == counts


def test_a_missing_prediction_file_is_one_sentence(tiny_model_path: Path, tmp_path: Path) -> None:
    proc = localspec("run", "hi", "--target", str(tiny_model_path), "--prediction",
                     str(tmp_path / "nope.txt"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--prediction" in proc.stderr
    both = localspec("run", "-", "--target", str(tiny_model_path), "--prediction", "-", stdin="x")
    assert both.returncode == 2 and "standard input" in both.stderr
