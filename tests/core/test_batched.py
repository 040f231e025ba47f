"""Batched generation (issue 17): several generations share each target pass.

Pure logic first (the k choice from a fake cost curve, the pass cost curve, chunked prefill),
then the real engine on a tiny model: every batched result equals the same request run alone,
with generations joining and leaving between steps, a long prompt prefilled in chunks while
others run, cancellation, and seeded sampling."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from localspec import _core
from localspec.runtime.engine import Engine
from localspec.runtime.engine_loop import PassReport
from localspec.types import GenerationParams, GenerationResult

T = _core.testing
GREEDY = GenerationParams(temperature=0.0, max_tokens=40, ignore_eos=True)
PROMPTS = [
    "the quick brown fox",
    "hello world, this is",
    "the cat sat on the mat and the dog sat on the log. the cat sat",
    "def main(): return",
    "one two three four one two three",
]


def curve(points: dict[int, float]) -> _core._Testing.PassCostCurve:
    c = T.PassCostCurve()
    for rows, seconds in points.items():
        c.observe(rows, seconds)
    return c


# ---- pure logic -------------------------------------------------------------------------

def test_a_flat_cost_curve_keeps_every_draft() -> None:
    flat = curve({1: 1.0, 64: 1.0})  # a GPU: 1 or 64 rows cost the same
    gains = [[0.9, 0.5, 0.1], [0.3], [0.8, 0.7]]
    assert T.batch_draft_lengths(gains, flat, 3, 3.0) == [3, 1, 2]


def test_when_the_batch_fills_the_hardware_nobody_drafts() -> None:
    linear = curve({1: 1.0, 2: 2.0, 64: 64.0})  # every row costs a whole pass
    gains = [[0.9, 0.8, 0.7], [0.95, 0.9]]
    assert T.batch_draft_lengths(gains, linear, 2, 2.0) == [0, 0]


def test_rows_go_to_the_drafts_most_likely_to_be_accepted() -> None:
    # Rows 2..4 cost little more than 2, then every row is dear: the two best tokens win.
    cost = curve({2: 1.0, 4: 1.05, 5: 2.0, 12: 9.0})
    gains = [[0.9, 0.85, 0.2], [0.3, 0.1]]
    assert T.batch_draft_lengths(gains, cost, 2, 2.0) == [2, 0]


def test_rows_that_are_not_cut_count_in_the_cost() -> None:
    cost = curve({1: 1.0, 4: 1.0, 5: 10.0, 12: 20.0})
    # Alone (base 1 row) the draft fits under the knee at 4 rows; with 4 base rows it does not.
    assert T.batch_draft_lengths([[0.9, 0.9, 0.9]], cost, 1, 1.0) == [3]
    assert T.batch_draft_lengths([[0.9, 0.9, 0.9]], cost, 4, 4.0) == [0]


def test_a_probe_runs_the_next_measured_row_count_above_the_choice() -> None:
    # Start-up calibration overestimated 8 rows (60 ms against a true 36): 4 sequences without
    # drafts (4 rows) look best, and a probe runs 8 rows, the next measured count above 4.
    cost = curve({1: 13.5, 4: 20.7, 8: 60.0, 16: 120.0})
    gains = [[0.9, 0.8]] * 4
    assert T.batch_draft_lengths(gains, cost, 4, 4.0) == [0, 0, 0, 0]
    assert T.batch_draft_lengths(gains, cost, 4, 4.0, probe=True) == [1, 1, 1, 1]
    # Beyond the last measured count the probe takes every gain; with none left, nothing.
    assert T.batch_draft_lengths(gains, curve({1: 13.5, 4: 20.7}), 4, 4.0, probe=True) == [2] * 4
    assert T.batch_draft_lengths([[], []], cost, 2, 2.0, probe=True) == [0, 0]


def test_what_probes_measure_corrects_the_choice() -> None:
    cost = curve({1: 13.5, 4: 20.7, 8: 60.0, 16: 120.0})
    gains = [[0.9, 0.8]] * 4
    probes = 0
    while T.batch_draft_lengths(gains, cost, 4, 4.0) == [0, 0, 0, 0]:
        rows = 4 + sum(T.batch_draft_lengths(gains, cost, 4, 4.0, probe=True))
        cost.observe(rows, 36.0 if rows == 8 else 20.7)  # what the probed pass took
        probes += 1
        assert probes < 20, "the probes never corrected the overestimated 8-row cost"
    assert T.batch_draft_lengths(gains, cost, 4, 4.0) == [1, 1, 1, 1]


def test_the_pass_cost_curve_interpolates_and_never_gets_cheaper() -> None:
    c = curve({1: 1.0, 3: 3.0, 8: 4.0})
    assert c.seconds(2) == pytest.approx(2.0)
    assert c.seconds(5) == pytest.approx(3.4)
    assert c.seconds(10) == pytest.approx(4.4)  # the last segment's slope, extended
    dip = curve({1: 1.0, 4: 2.0, 8: 1.5})  # CPUs: 8 rows can cost less than 4
    assert dip.seconds(6) >= dip.seconds(4)


def test_a_preempted_pass_moves_the_estimate_only_a_little() -> None:
    c = curve({4: 1.0})
    c.observe(4, 100.0)  # another process took the CPU: at most twice the estimate counts
    assert c.seconds(4) == pytest.approx(1.2)


def test_prefill_reads_one_prompt_per_pass_whole_when_nobody_waits() -> None:
    assert T.plan_prefill([300, 700], False, 256) == [300, 0]  # the next one after a pass
    assert T.plan_prefill([300, 700], True, 256) == [256, 0]  # oldest first, in chunks
    assert T.plan_prefill([100, 700], True, 256) == [100, 0]
    assert T.plan_prefill([0, 50], True, 256) == [0, 50]  # a cached prompt costs nothing
    assert T.plan_prefill([0, 0], False, 256) == [0, 0]


# ---- the engine ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def solo(tiny_model_path: Path) -> Iterator[Engine]:
    engine = Engine.load(tiny_model_path, draft="ngram", n_threads=1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def batched(tiny_model_path: Path) -> Iterator[Engine]:
    engine = Engine.load(tiny_model_path, draft="ngram", n_threads=1, parallel=4)
    yield engine
    engine.close()


def alone(engine: Engine, prompt: str, params: GenerationParams) -> GenerationResult:
    return engine.generate(prompt, params)


def test_the_engine_reports_its_slots(batched: Engine, solo: Engine) -> None:
    assert batched.info.parallel == 4 and solo.info.parallel == 1


def test_concurrent_greedy_requests_equal_each_run_alone(solo: Engine, batched: Engine) -> None:
    passes: list[PassReport] = []
    batched.observe_passes(passes.append)
    params = [replace(GREEDY, max_tokens=12 + 9 * i) for i in range(len(PROMPTS))]  # leave apart
    expected = [alone(solo, p, q).tokens for p, q in zip(PROMPTS, params, strict=True)]
    handles = [batched.submit(p, q) for p, q in zip(PROMPTS, params, strict=True)]
    results = [h.result(timeout=120) for h in handles]
    assert [r.tokens for r in results] == expected
    for r, q in zip(results, params, strict=True):
        assert r.stats.n_tokens == len(r.tokens) == q.max_tokens  # stats are per request
    assert max(p.sequences for p in passes) == 4  # 5 requests, 4 slots: the fifth waited
    assert any(p.sequences > 1 and p.rows > p.sequences for p in passes) or all(
        r.stats.drafted == 0 for r in results
    )


def test_a_request_joins_while_others_generate(solo: Engine, batched: Engine) -> None:
    long_params = replace(GREEDY, max_tokens=120)
    first = batched.submit(PROMPTS[2], long_params)
    chunks = iter(first)
    next(chunks)  # the first generation is running
    # A long prompt joins: it is prefilled in pieces between the first one's steps.
    joining_prompt = " ".join(["the cat sat on the mat"] * 60)
    second = batched.submit(joining_prompt, GREEDY)
    assert second.result(timeout=120).tokens == alone(solo, joining_prompt, GREEDY).tokens
    assert first.result(timeout=120).tokens == alone(solo, PROMPTS[2], long_params).tokens


def test_prompts_that_arrive_together_join_one_per_pass(solo: Engine, batched: Engine) -> None:
    # Each new stream's first token comes after its own prompt, not after every prompt: the
    # pass after a prefill holds at most one sequence more than the pass before it.
    passes: list[PassReport] = []
    first = batched.submit(PROMPTS[2], replace(GREEDY, max_tokens=120))
    chunks = iter(first)
    next(chunks)
    batched.observe_passes(passes.append)
    handles = [batched.submit(p, GREEDY) for p in PROMPTS[:3]]
    results = [h.result(timeout=120) for h in handles]
    assert [r.tokens for r in results] == [alone(solo, p, GREEDY).tokens for p in PROMPTS[:3]]
    first.result(timeout=120)
    counts = [p.sequences for p in passes]
    assert max(counts) == 4
    assert all(b - a <= 1 for a, b in zip(counts, counts[1:], strict=False)), counts


def test_cancelling_one_generation_leaves_the_others_untouched(
    solo: Engine, batched: Engine
) -> None:
    params = replace(GREEDY, max_tokens=200)
    doomed = batched.submit(PROMPTS[0], params)
    kept = batched.submit(PROMPTS[1], GREEDY)
    next(iter(doomed))
    doomed.cancel()
    assert doomed.result(timeout=60).finish_reason == "cancelled"
    assert doomed.result().stats.n_tokens < 200
    assert kept.result(timeout=60).tokens == alone(solo, PROMPTS[1], GREEDY).tokens


def test_seeded_sampling_is_reproducible_in_a_batch(solo: Engine, batched: Engine) -> None:
    sampled = GenerationParams(temperature=0.8, seed=1234, max_tokens=30, ignore_eos=True)
    expected = alone(solo, PROMPTS[3], sampled).tokens
    results: list[list[int]] = []

    def run() -> None:
        results.append(batched.generate(PROMPTS[3], sampled).tokens)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [expected] * 3


def test_a_draft_model_keeps_a_cache_per_generation(
    tiny_model_path: Path, tiny_draft_path: Path
) -> None:
    """Four generations share the target's passes, each drafting from its own slot of the
    draft model's cache (Drafter::select): every result equals the request run alone."""
    params = [replace(GREEDY, max_tokens=30 + 7 * i, draft_max=3) for i in range(len(PROMPTS))]
    with Engine.load(tiny_model_path, draft=str(tiny_draft_path), n_threads=1,
                     draft_p_min=0.0) as solo_draft:
        expected = [solo_draft.generate(p, q) for p, q in zip(PROMPTS, params, strict=True)]
    passes: list[PassReport] = []
    with Engine.load(tiny_model_path, draft=str(tiny_draft_path), n_threads=1,
                     draft_p_min=0.0, parallel=4) as engine:
        assert engine.info.parallel == 4 and engine.info.notice == ""
        engine.observe_passes(passes.append)
        handles = [engine.submit(p, q) for p, q in zip(PROMPTS, params, strict=True)]
        results = [h.result(timeout=300) for h in handles]
    assert [r.tokens for r in results] == [e.tokens for e in expected]
    assert sum(r.stats.model_drafted for r in results) > 100
    assert any(p.sequences > 1 and p.rows > p.sequences for p in passes)


# ---- the server -----------------------------------------------------------------------------

def test_the_server_streams_two_requests_at_once(batched: Engine) -> None:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from localspec.server import create_app
    from localspec.server.background import BackgroundServer
    from localspec.server.options import ServerOptions

    app = create_app(batched, ServerOptions())
    body = {"model": batched.info.target_name, "prompt": PROMPTS[0], "max_tokens": 400,
            "temperature": 0, "ignore_eos": True, "stream": True}
    with BackgroundServer(app) as server:
        url = f"{server.base_url}/v1/completions"
        with httpx.stream("POST", url, json=body, timeout=60) as first:
            lines = first.iter_lines()
            next(line for line in lines if line.startswith("data: "))  # the first is running
            # A second, short request finishes while the first is still streaming.
            short = httpx.post(url, json={**body, "max_tokens": 5, "stream": False}, timeout=60)
            assert short.status_code == 200
            assert short.json()["usage"]["completion_tokens"] == 5
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and len(rest) > 2
        text = httpx.get(f"{server.base_url}/metrics").text
    samples = {s.name + str(s.labels.get("le", "")): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    # Some passes held both generations: fewer single-generation passes than passes.
    assert samples["localspec_batch_size_bucket1.0"] < samples["localspec_batch_size_count"]
    assert samples["localspec_pass_rows_count"] == samples["localspec_batch_size_count"]


def test_bench_clients_compares_servers(tiny_model_path: Path) -> None:
    import json

    from tests.fixtures.helpers import run_bench

    done = run_bench("--target", str(tiny_model_path), "--draft", "ngram", "--clients", "1,2",
                     "--parallel", "2", "--repeat", "1", "--max-tokens", "8", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert [row["clients"] for row in rows] == [1, 2]
    for row in rows:
        assert row["tokens_per_second_parallel_1"] > 0 and row["tokens_per_second_parallel_2"] > 0
        assert row["median_ttft_parallel_2"] > 0


def test_bench_clients_rounds_take_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both servers stay up and the rounds alternate between them, the order swapped on every
    repeat, so that drift hits both alike (the servers and rounds are stand-ins here; the test
    above runs real ones)."""
    from contextlib import contextmanager

    from localspec.bench import serving
    from localspec.bench.prompts import Prompt

    up: list[int] = []

    @contextmanager
    def server(_args: list[str], slots: int) -> Iterator[str]:
        up.append(slots)
        yield f"url{slots}"

    monkeypatch.setattr(serving, "_Server", server)
    monkeypatch.setattr(serving, "_request", lambda *args, **kwargs: (1, 0.1))
    monkeypatch.setattr(serving, "_round", lambda url, slots, prompts, params: serving.Round(
        slots, len(prompts), 1, 1.0, [0.1]))
    prompts = [Prompt(f"p{i}", "qa", f"text {i}") for i in range(2)]
    rounds = serving.run_serving([], prompts, GenerationParams(), [1, 2], 4, repeat=2)
    assert up == [1, 4]
    assert [(r.parallel, r.clients) for r in rounds] == [
        (1, 1), (4, 1), (1, 2), (4, 2), (4, 1), (1, 1), (4, 2), (1, 2)]


def test_bench_clients_refuses_a_bad_list(tiny_model_path: Path) -> None:
    from tests.fixtures.helpers import run_bench

    done = run_bench("--target", str(tiny_model_path), "--clients", "0,x")
    assert done.returncode == 2 and "--clients" in done.stderr
    assert "Traceback" not in done.stderr
