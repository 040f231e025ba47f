"""The bench's draft-vocabulary coverage for an EAGLE-3 head (localspec/bench/coverage.py): a
real `localspec bench` run with a tiny head whose d2t holds part of the target's vocabulary,
checked against the head's d2t as the core reads it and against plain outputs generated apart."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from localspec import _core
from localspec.models.gguf_reader import read_gguf
from localspec.runtime.engine import Engine
from localspec.testing.heads import HeadSpec, write_eagle3_head
from localspec.types import GenerationParams
from tests.fixtures.helpers import run_bench

PROMPTS = {"stories": "once upon a time there was a small model", "facts": "the quick brown fox"}
MAX_TOKENS = 24


def core_d2t(target: Path, head: Path) -> set[int]:
    """The head's draft vocabulary as the core loads it (not through the bench's reader)."""
    width = 3 * read_gguf(target, read_arrays=False).n_embd
    probe = _core.eagle3_head_logits(str(target), str(head), [1, 2], np.zeros((2, width)), [])
    return set(probe["d2t"])


def test_bench_reports_the_share_of_plain_tokens_the_head_can_draft(
        tmp_path: Path, tiny_model_path: Path) -> None:
    n_vocab = read_gguf(tiny_model_path, read_arrays=False).vocab_size
    head = write_eagle3_head(tmp_path / "head.gguf", tiny_model_path,
                             HeadSpec(draft_vocab=n_vocab // 2, seed=5))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"{c}-01", "category": c, "prompt": p}) + "\n"
                               for c, p in PROMPTS.items()))
    done = run_bench("--target", str(tiny_model_path), "--draft", f"eagle3:{head}", "--prompts",
                     str(prompts), "--max-tokens", str(MAX_TOKENS), "--repeat", "1", "--json")
    assert done.returncode == 0, done.stderr
    reported = json.loads(done.stdout)["draft_vocab_coverage"]

    vocabulary = core_d2t(tiny_model_path, head)
    assert len(vocabulary) == n_vocab // 2
    params = GenerationParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                              draft_max=0)
    outputs: dict[str, list[int]] = {}
    with Engine.load(tiny_model_path, draft="none", n_threads=1) as engine:
        for category, prompt in PROMPTS.items():
            outputs[category] = list(engine.generate(engine.tokenize(prompt), params).tokens)
    expected = {c: sum(t in vocabulary for t in ids) / len(ids) for c, ids in outputs.items()}
    every = [t for ids in outputs.values() for t in ids]
    expected["all"] = sum(t in vocabulary for t in every) / len(every)
    assert reported == expected
    assert 0.0 < expected["all"] < 1.0  # the check can tell a wrong vocabulary from a right one


def test_no_coverage_without_a_head(tmp_path: Path, tiny_model_path: Path) -> None:
    done = run_bench("--target", str(tiny_model_path), "--draft", "ngram", "--limit", "1",
                     "--categories", "code", "--max-tokens", "8", "--repeat", "1", "--json")
    assert done.returncode == 0, done.stderr
    assert "draft_vocab_coverage" not in json.loads(done.stdout)
