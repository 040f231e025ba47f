"""MTP drafting through the core (docs/design.md, "Hidden-state drafting"): a tiny glm4moe
target whose NextN layer drafts from the target's own final hidden states. Whatever the layer
drafts, the output is the target's: greedy output equals plain decoding token for token (the
layer alone and chained with n-gram, fixed k and the controller, across requests that reuse the
cache and a cancelled one), and sampling follows the target's distribution. As everywhere
(tests/core/test_generation.py), a greedy divergence is allowed only as a numerical tie that the
target's same-shape replay confirms."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from localspec import _core
from localspec.bench.lossless import compare_greedy
from localspec.errors import InvalidParameterError
from localspec.runtime.convert import params_to_core, stats_from_core
from localspec.runtime.engine import Engine
from localspec.testing.mtp import MtpSpec, write_mtp_model
from localspec.types import GenerationParams, GenerationResult
from tests.fixtures.helpers import mtp_core_alone
from tests.fixtures.helpers import run_localspec as localspec
from tests.fixtures.stats_helpers import UNTRUNCATED, assert_first_two_tokens_fit

GREEDY = GenerationParams(temperature=0.0, max_tokens=300, ignore_eos=True)
PROMPT = "the quick brown fox jumps over the lazy dog and the speculative"


@pytest.fixture(scope="module")
def targets(model_dir: Path) -> dict[str, Path]:
    return {
        "mtp": write_mtp_model(model_dir / "mtp.gguf", MtpSpec(divergence=1.0)),
        "useless": write_mtp_model(model_dir / "mtp-useless.gguf",
                                   MtpSpec(divergence=1.0, useless=True)),
        "none": write_mtp_model(model_dir / "mtp-none.gguf",
                                MtpSpec(divergence=1.0, with_mtp=False)),
    }


@pytest.fixture(scope="module")
def plain(targets):
    engine = Engine.load(targets["mtp"], draft="none", n_ctx=1024, n_threads=1)
    yield engine
    engine.close()


def load(target: Path, draft: str = "mtp") -> Engine:
    return Engine.load(target, draft=draft, n_ctx=1024, draft_p_min=0.0, n_threads=1)


def assert_same_or_tie(plain: Engine, prompt: str | list[int], expected: list[int],
                       result: GenerationResult) -> None:
    tokens = plain.tokenize(prompt) if isinstance(prompt, str) else prompt
    divergence = compare_greedy(plain, tokens, expected, result)
    assert divergence is None or divergence.verdict == "tie", divergence


@pytest.mark.parametrize("draft", ["mtp", "auto"])
@pytest.mark.parametrize("draft_max", [3, "auto"])
def test_greedy_output_equals_plain(plain, targets, draft: str, draft_max) -> None:
    engine = load(targets["mtp"], draft)
    try:
        assert engine.info.drafter == "mtp"  # "auto" picks the layers up
        expected = plain.generate(PROMPT, GREEDY)
        got = engine.generate(PROMPT, GREEDY, draft_max=draft_max)
        assert_same_or_tie(plain, PROMPT, expected.tokens, got)
        if draft_max == 3:
            assert got.stats.model_drafted > 100 and got.stats.rejected > 0  # rollbacks
            assert got.stats.accepted > 20  # and accepted drafts crossed them
    finally:
        engine.close()


def test_the_layers_alone_equal_plain(plain, targets) -> None:
    core = mtp_core_alone(targets["mtp"])
    prompt = plain.tokenize(PROMPT)
    try:
        for draft_max in (3, 5):
            request = params_to_core(replace(GREEDY, draft_max=draft_max, seed=1), prompt)
            raw = core.generate(request, None)
            got = GenerationResult(raw["text"], list(raw["tokens"]), [], raw["finish_reason"],
                                   stats_from_core(raw["stats"]), pass_rows=raw["pass_rows"],
                                   pass_emitted=raw["pass_emitted"])
            assert got.stats.model_drafted == got.stats.drafted > 200
            assert got.stats.accepted > 10 and got.stats.rejected > 0
            assert_same_or_tie(plain, prompt, plain.generate(prompt, GREEDY).tokens, got)
    finally:
        core.close()


def test_cache_reuse_long_prompts_and_cancel(plain, targets) -> None:
    """Requests that share a prefix, one that rewrites an old prefix, a prompt longer than one
    MTP batch (64 rows), a plain request in between (no states recorded) and a cancelled
    stream: each equals plain decoding."""
    engine = load(targets["mtp"])
    long_prompt = list(range(5, 300)) * 2 + list(range(7, 120))  # 703 tokens
    short = GenerationParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    try:
        for prompt in [PROMPT, PROMPT + " and again", long_prompt, "zq " + PROMPT, PROMPT]:
            got = engine.generate(prompt, short, draft_max=4)
            assert_same_or_tie(plain, prompt, plain.generate(prompt, short).tokens, got)
        engine.generate(PROMPT + " plain", short, draft_max=0)
        stream = engine.stream(PROMPT, short, draft_max=4)
        next(stream)
        stream.close()  # cancelled mid-generation; the next request still matches
        for prompt in [PROMPT, PROMPT + " plain and on"]:
            got = engine.generate(prompt, short, draft_max=4)
            assert_same_or_tie(plain, prompt, plain.generate(prompt, short).tokens, got)
    finally:
        engine.close()


def sample_outputs(target: Path, prompt: list[int], params: GenerationParams,
                   n: int) -> list[GenerationResult]:
    engine = load(target)
    try:
        return [engine.generate(prompt, params, seed=seed, draft_max=3) for seed in range(n)]
    finally:
        engine.close()


def test_sampling_follows_the_target_distribution(plain, targets) -> None:
    """First and second tokens over many seeds fit the target's warped distribution, with the
    layers' q in the rejection rule."""
    params = GenerationParams(max_tokens=2, **UNTRUNCATED)
    prompt = plain.tokenize("zq the quick brown fox")
    outputs = sample_outputs(targets["mtp"], prompt, params, 2000)
    drafted = sum(o.stats.drafted for o in outputs)
    accepted = sum(o.stats.accepted for o in outputs)
    assert drafted > 1500 and 50 < accepted < drafted - 50
    assert_first_two_tokens_fit(plain, prompt, outputs)


def test_the_controller_turns_useless_layers_off(targets) -> None:
    """Random MTP weights whose drafts are (almost) never accepted: with the controller,
    drafting stops after a few probes."""
    engine = load(targets["useless"])
    params = GenerationParams(
        temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=400, ignore_eos=True, seed=5
    )
    try:
        fixed = engine.generate(PROMPT, params, draft_max=3)
        auto = engine.generate(PROMPT, params, draft_max="auto", reuse_cache=False)
    finally:
        engine.close()
    assert fixed.stats.model_drafted > 600 and fixed.stats.acceptance_rate < 0.1
    assert auto.stats.model_drafted < fixed.stats.model_drafted / 5


def test_mtp_on_a_target_without_the_layers(targets) -> None:
    """--draft mtp needs NextN layers: one sentence; "auto" falls back to n-gram lookup."""
    with pytest.raises(InvalidParameterError, match="has no MTP \\(NextN\\) layers; use --draft"):
        load(targets["none"])
    engine = load(targets["none"], "auto")
    try:
        assert engine.info.drafter == "ngram"
    finally:
        engine.close()
    assert _core.mtp_unsupported(str(targets["mtp"])) == ""


def test_batched_generations_draft_from_their_own_states(plain, targets) -> None:
    """Four generations share the target's passes, each with the MTP layers' context of its
    slot reading that generation's hidden states: every result equals plain decoding, and each
    drafts and is accepted exactly as when it runs alone (fixed draft length), which it could
    not if a slot read another generation's states."""
    prompts = [PROMPT, "zq the quick brown fox", "hello world, this is", "one two three four"]
    params = [GenerationParams(temperature=0.0, max_tokens=60 + 9 * i, ignore_eos=True,
                               draft_max=3) for i in range(len(prompts))]
    expected = [plain.generate(p, replace(q, draft_max=0)).tokens
                for p, q in zip(prompts, params, strict=True)]
    with Engine.load(targets["mtp"], draft="mtp", n_ctx=1024, draft_p_min=0.0, parallel=4,
                     n_threads=1) as engine:
        assert engine.info.parallel == 4 and engine.info.notice == ""
        handles = [engine.submit(p, q) for p, q in zip(prompts, params, strict=True)]
        results = [h.result(timeout=300) for h in handles]
    for prompt, want, got in zip(prompts, expected, results, strict=True):
        assert_same_or_tie(plain, prompt, want, got)
    with Engine.load(targets["mtp"], draft="mtp", n_ctx=1024, draft_p_min=0.0,
                     n_threads=1) as solo:
        alone = [solo.generate(p, q).stats for p, q in zip(prompts, params, strict=True)]
    assert [(r.stats.drafted, r.stats.accepted) for r in results] == [
        (s.drafted, s.accepted) for s in alone]
    assert sum(r.stats.model_drafted for r in results) > 100


HIDDEN_EXT = """
import sys
from localspec.runtime.engine import Engine
from localspec.errors import LocalspecError
target = sys.argv[1]
engine = Engine.load(target, n_ctx=256)
print("auto:", engine.info.drafter)
engine.close()
try:
    Engine.load(target, draft="mtp", n_ctx=256)
except LocalspecError as error:
    print("mtp:", error)
"""


def test_a_libllama_without_the_extensions(targets) -> None:
    """Without llama.cpp's C++-only extension functions, `import localspec` works, "auto"
    drafts with n-gram lookup and "mtp" says what is missing."""
    env = dict(os.environ, LOCALSPEC_HIDE_LLAMA_EXT="1")
    args = [sys.executable, "-c", HIDDEN_EXT, str(targets["mtp"])]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "auto: ngram" in proc.stdout
    assert "mtp: this libllama does not export llama_set_embeddings_nextn" in proc.stdout


def test_the_cli_names_the_problem_and_plans_the_mtp_context(targets) -> None:
    """`run --draft mtp` on a target without the layers exits 2 with the sentence; `plan` gives
    the MTP context (its KV cache, its compute buffer) its own column, and `check` names the
    drafter that `auto` picked."""
    proc = localspec("run", "hi", "--target", str(targets["none"]), "--draft", "mtp")
    assert proc.returncode == 2 and "has no MTP (NextN) layers" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = localspec("plan", "--target", str(targets["mtp"]), "--ctx", "1024", "--json")
    plan = json.loads(proc.stdout)
    assert plan["draft"]["name"] == "MTP layers" and plan["draft"]["is_mtp"]
    assert plan["draft"]["kv_device"] > 0 and plan["draft"]["compute"] > 0
    assert plan["draft"]["weights_device"] == 0  # the layer's weights are the target's
    table = localspec("plan", "--target", str(targets["mtp"]), "--draft", "mtp").stdout
    assert "MTP layers" in table
    plain = json.loads(localspec("plan", "--target", str(targets["none"]), "--ctx", "1024",
                                 "--json").stdout)
    assert plain["draft"] is None and plain["target"]["kv_device"] == plan["target"]["kv_device"]
    proc = localspec("check", "--target", str(targets["mtp"]), "--max-tokens", "8",
                     "--categories", "qa", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert "Draft:  mtp" in proc.stdout and "MTP (NextN) layers draft" in proc.stdout


def test_mtp_drafts_are_counted_as_their_own_kind(targets) -> None:
    """The statistics (and /metrics) count MTP drafts under "mtp", apart from n-gram lookups."""
    engine = load(targets["mtp"])
    try:
        got = engine.generate("zq " + PROMPT, GREEDY, draft_max=3)
    finally:
        engine.close()
    drafted, accepted = got.stats.drafted_by_kind, got.stats.accepted_by_kind
    assert drafted["mtp"] == got.stats.model_drafted > 0
    assert drafted["mtp"] + drafted["ngram"] == got.stats.drafted
    assert 0 < accepted["mtp"] <= drafted["mtp"]
