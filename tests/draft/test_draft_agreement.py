"""The seeds' diagnostic of `localspec check`: 1 - TV(p, q), argmax agreement and logit cosine,
on hand-made distributions and through `check` on real tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from localspec.bench.draft_agreement import agreement
from tests.fixtures.helpers import run_localspec as localspec


def logits_of(probs: list[float]) -> np.ndarray:
    return np.log(np.asarray(probs, dtype=np.float64))


def test_one_minus_tv_is_the_overlap_of_the_distributions() -> None:
    p = np.stack([logits_of([0.7, 0.2, 0.1]), logits_of([0.1, 0.1, 0.8])])
    q = np.stack([logits_of([0.4, 0.5, 0.1]), logits_of([0.1, 0.1, 0.8])])
    got = agreement(p, q)
    # Row 0: min(.7,.4) + min(.2,.5) + min(.1,.1) = 0.7; row 1: identical, 1.0.
    assert got.one_minus_tv == pytest.approx((0.7 + 1.0) / 2)
    assert got.top1 == pytest.approx(0.5)  # argmax 0 vs 1, then 2 vs 2
    assert got.positions == 2


def test_a_draft_vocabulary_maps_through_its_ids() -> None:
    p = logits_of([0.5, 0.1, 0.4])[None, :]
    q = logits_of([0.6, 0.4])[None, :]  # draft id 0 is target id 2, draft id 1 is target id 0
    got = agreement(p, q, np.array([2, 0]))
    assert got.one_minus_tv == pytest.approx(min(0.4, 0.6) + min(0.5, 0.4))
    assert got.top1 == 0.0  # the draft's best (target id 2) is not the target's (0)
    same = agreement(p, logits_of([0.4, 0.5])[None, :], np.array([2, 0]))
    assert same.top1 == 1.0
    # Mass on an id the target does not have can never be accepted.
    outside = agreement(p, logits_of([0.5, 0.5])[None, :], np.array([0, 7]))
    assert outside.one_minus_tv == pytest.approx(0.5)


def test_cosine_is_one_for_proportional_logits_only() -> None:
    p = np.array([[1.0, 2.0, 3.0]])
    assert agreement(p, 2 * p).cosine == pytest.approx(1.0)
    assert agreement(p, np.array([[3.0, 2.0, 1.0]])).cosine < 0.8


def check_json(target: Path, draft: Path) -> dict:
    # A fixed draft length: on a GPU the controller may rightly draft nothing for a tiny pair
    proc = localspec("check", "--target", str(target), "--draft", str(draft), "--max-tokens", "16",
                     "--categories", "qa,code", "--threads", "1", "--draft-max", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_check_reports_agreement_of_a_draft_model(tiny_model_path: Path,
                                                  tiny_draft_path: Path) -> None:
    """A draft identical to the target agrees everywhere (so the rows are aligned); another
    draft agrees less, and its argmax agreement is what greedy drafting measured."""
    itself = check_json(tiny_model_path, tiny_model_path)["agreement"]
    assert itself["top1"] == 1.0 and itself["one_minus_tv"] > 0.99 and itself["cosine"] > 0.99
    assert itself["positions"] == 2 * 16  # one per generated token
    data = check_json(tiny_model_path, tiny_draft_path)
    other = data["agreement"]
    assert 0 < other["one_minus_tv"] < itself["one_minus_tv"]
    assert other["top1"] < 1.0
    by_position = data["acceptance_by_position"]
    assert by_position and 0 <= by_position[0] <= 1


def test_check_text_shows_the_diagnostic(tiny_model_path: Path, tiny_draft_path: Path) -> None:
    proc = localspec("check", "--target", str(tiny_model_path), "--draft", str(tiny_draft_path),
                     "--max-tokens", "8", "--categories", "qa", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    for fragment in ("acceptance by position", "predicted, 1 - TV(p,q)", "measured, position 1",
                     "logit cosine"):
        assert fragment in proc.stdout, fragment


def test_ngram_has_no_distribution_to_compare(tiny_model_path: Path) -> None:
    proc = localspec("check", "--target", str(tiny_model_path), "--draft", "ngram",
                     "--max-tokens", "8", "--categories", "qa", "--threads", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["agreement"] is None


def test_check_reports_agreement_of_a_head(model_dir: Path, tiny_model_path: Path) -> None:
    """For an EAGLE-3 head q lives on its draft vocabulary (d2t): the diagnostic still covers
    every generated position (the row alignment is tested in tests/train/test_train_cli.py)."""
    from localspec.testing.heads import HeadSpec, write_eagle3_head

    head = write_eagle3_head(model_dir / "check-head.gguf", tiny_model_path,
                             HeadSpec(draft_vocab=128, seed=3))
    got = check_json(tiny_model_path, Path(f"eagle3:{head}"))["agreement"]
    assert got["positions"] == 2 * 16
    assert 0 <= got["one_minus_tv"] < 0.5 and -1 <= got["cosine"] <= 1
