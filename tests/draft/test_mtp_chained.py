"""Targets with several MTP (NextN) layers (docs/design.md, "Hidden-state drafting"): a tiny
hy_v3 target with two, whose draft position i runs layer i (chained, as llama.cpp's own MTP
drafter does). Greedy output equals plain decoding; the second layer is the one that drafts
position 2 (a useless second layer loses position 2 only); a draft never has more tokens than
there are layers. And `check`'s diagnostic for MTP reads the rows the layers draft from."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from localspec import _core
from localspec.bench.draft_agreement import MtpQ
from localspec.bench.lossless import compare_greedy
from localspec.runtime.convert import params_to_core, stats_from_core
from localspec.runtime.engine import Engine
from localspec.testing.mtp import MtpSpec, write_mtp_model
from localspec.types import GenerationParams, GenerationResult, GenerationStats
from tests.fixtures.helpers import length_one_counts, mtp_core_alone
from tests.fixtures.helpers import run_localspec as localspec
from tests.fixtures.stats_helpers import UNTRUNCATED, assert_first_two_tokens_fit

GREEDY = GenerationParams(temperature=0.0, max_tokens=300, ignore_eos=True)
PROMPT = "the quick brown fox jumps over the lazy dog and the speculative"


@pytest.fixture(scope="module")
def targets(model_dir: Path) -> dict[str, Path]:
    def chained(name: str, **kw: object) -> Path:
        spec = MtpSpec(divergence=0.3, arch="hy_v3", n_nextn=2, **kw)  # type: ignore[arg-type]
        return write_mtp_model(model_dir / f"{name}.gguf", spec)

    return {
        "two": chained("mtp2"),
        "second-useless": chained("mtp2-second-useless", useless_layers=(1,)),
        "glm": write_mtp_model(model_dir / "mtp-glm.gguf", MtpSpec(divergence=1.0)),
    }


def generate(core: _core.Core, prompt: list[int], params: GenerationParams) -> GenerationResult:
    raw = core.generate(params_to_core(params, prompt), None)
    return GenerationResult(raw["text"], list(raw["tokens"]), [], raw["finish_reason"],
                            stats_from_core(raw["stats"]), pass_rows=raw["pass_rows"],
                            pass_emitted=raw["pass_emitted"])


def by_position(stats: GenerationStats) -> list[float]:
    return [a / d if d else 0.0
            for a, d in zip(stats.accepted_by_position, stats.drafted_by_position, strict=False)]


def test_two_layers_chain_and_equal_plain(targets) -> None:
    """Greedy output equals plain with drafts up to 4 asked for (rollbacks included), and the
    drafts stop at two tokens: one per layer."""
    with Engine.load(targets["two"], draft="none", n_ctx=1024, n_threads=1) as plain:
        prompt = plain.tokenize(PROMPT)
        expected = plain.generate(prompt, GREEDY).tokens
        core = mtp_core_alone(targets["two"])
        try:
            got = generate(core, prompt, replace(GREEDY, draft_max=4, seed=1))
        finally:
            core.close()
        divergence = compare_greedy(plain, prompt, expected, got)
    assert divergence is None or divergence.verdict == "tie", divergence
    assert got.stats.model_drafted > 200 and got.stats.rejected > 0
    assert len(got.stats.drafted_by_position) == 2  # never a third position
    assert all(by_position(got.stats)), by_position(got.stats)  # both layers' drafts accepted


def test_the_second_layer_drafts_position_two(targets) -> None:
    """The same first layer, a random second one: position 1 is accepted as often as with the
    good second layer, position 2 almost never. Were position 2 drafted with layer 0 again,
    the two targets would draft alike."""
    rates = {}
    for name in ("two", "second-useless"):
        core = mtp_core_alone(targets[name])
        try:
            prompt = list(core.tokenize(PROMPT, True, False))
            got = generate(core, prompt, replace(GREEDY, draft_max=2, seed=1))
        finally:
            core.close()
        rates[name] = by_position(got.stats)
    assert rates["two"][1] > 0.5, rates
    assert rates["second-useless"][1] < 0.1 < rates["second-useless"][0], rates


def test_check_names_the_chained_layers(targets) -> None:
    proc = localspec("check", "--target", str(targets["two"]), "--max-tokens", "8",
                     "--categories", "qa", "--threads", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["draft"] == "mtp" and data["mtp_layers"].startswith("2 layers, chained")
    glm = localspec("check", "--target", str(targets["glm"]), "--max-tokens", "8",
                    "--categories", "qa", "--threads", "1")
    assert glm.returncode == 0, glm.stderr
    assert "MTP (NextN) layers draft (1 layer" in glm.stdout
    for fragment in ("predicted, 1 - TV(p,q)", "logit cosine"):
        assert fragment in glm.stdout, fragment


def test_a_single_layer_graph_refuses_two_layers(model_dir: Path, targets) -> None:
    """glm4moe's MTP graph in llama.cpp runs one NextN layer (it asserts so): a glm4moe GGUF
    with two is refused with one sentence before llama.cpp could abort."""
    assert _core.mtp_unsupported(str(targets["glm"])) == ""
    assert _core.mtp_unsupported(str(targets["two"])) == ""
    two = write_mtp_model(model_dir / "glm-two-layers.gguf", MtpSpec(n_nextn=2))
    why = _core.mtp_unsupported(str(two))
    assert "glm4moe MTP graph runs one NextN layer" in why and "has 2" in why, why
    proc = localspec("run", "hi", "--target", str(two), "--draft", "mtp", "--threads", "1")
    assert proc.returncode == 2 and why in proc.stderr.replace("\n", " ")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("name", ["glm", "two"])
def test_the_mtp_diagnostic_reads_the_rows_the_layers_draft_from(targets, name: str) -> None:
    """`check`'s q rows for MTP (localspec.bench.draft_agreement.MtpQ) are the ones the drafter
    takes
    its first token from: walking the plain output with draft length 1 (an accepted draft
    moves two positions on, a rejected one, one) and accepting where argmax q == argmax p
    reproduces the engine's counts exactly."""
    n = 200
    params = GenerationParams(temperature=0.0, max_tokens=n, ignore_eos=True, draft_max=1)
    core = mtp_core_alone(targets[name])
    try:
        prompt = list(core.tokenize(PROMPT, True, False))
        result = generate(core, prompt, params)
    finally:
        core.close()
    tokens = prompt + result.tokens
    with Engine.load(targets[name], draft="none", n_ctx=1024, n_threads=1) as plain:
        p = plain.pass_logits(tokens, len(tokens))[:-1]
    q, start, ids = MtpQ(str(targets[name]), 1).rows(tokens)
    drafted, accepted = length_one_counts(p, q, start, ids, len(prompt) - 1, n)
    assert (result.stats.drafted, result.stats.accepted) == (drafted, accepted)
    assert 0 < accepted < drafted


def test_sampling_with_chained_layers_follows_the_target(targets) -> None:
    """Sampled drafts of both layers (their q in the rejection rule): the first two tokens over
    many seeds fit the target's distribution."""
    params = GenerationParams(max_tokens=2, **UNTRUNCATED)
    with Engine.load(targets["two"], draft="none", n_ctx=1024, n_threads=1) as plain, \
            Engine.load(targets["two"], draft="mtp", n_ctx=1024, draft_p_min=0.0,
                        n_threads=1) as spec:
        prompt = plain.tokenize("zq the quick brown fox")
        outputs = [spec.generate(prompt, params, seed=seed, draft_max=2) for seed in range(2000)]
        assert_first_two_tokens_fit(plain, prompt, outputs)
    drafted = sum(o.stats.model_drafted for o in outputs)
    accepted = sum(o.stats.accepted for o in outputs)
    assert drafted > 1500 and 50 < accepted < drafted - 50
