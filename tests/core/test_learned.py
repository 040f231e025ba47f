"""What the controller learned: kept across the requests of one engine, saved by `localspec run`
in the cache directory, restored by the next run, reset on request."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from localspec import _core
from localspec.runtime.engine import Engine
from localspec.runtime.learned import (
    NOISY_TIMINGS,
    LearnedKey,
    learned_path,
    load_learned,
    read_learned,
    save_learned,
)
from tests.fixtures.helpers import run_localspec

REPETITIVE = "one two three four five six. one two three four five six. one two three four"


def test_the_engine_keeps_what_it_learned_across_requests(tiny_model_path: Path) -> None:
    with Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1) as engine:
        before = engine.learned()
        assert max(before.verify) == 0.0  # nothing measured before the first request
        engine.generate(REPETITIVE, max_tokens=48, temperature=0, ignore_eos=True)
        first = engine.learned()
        assert all(v > 0 for v in first.verify[1:])  # every pass size calibrated
        engine.generate(REPETITIVE, max_tokens=48, temperature=0, ignore_eos=True)
        second = engine.learned()
    n_ngram_trials = sum(sum(row) for row in second.trials[1:])
    assert n_ngram_trials > 0, "n-gram drafts were observed"
    assert second.trials != first.trials  # the second request added to the first one's memory


def test_warm_up_calibrates_before_the_first_request_and_changes_no_output(
        tiny_model_path: Path) -> None:
    with Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1) as solo:
        expected = solo.generate(REPETITIVE, max_tokens=40, temperature=0, ignore_eos=True)
    for parallel in (1, 2):
        with Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1,
                         parallel=parallel) as engine:
            engine.warm_up()
            assert all(v > 0 for v in engine.learned().verify[1:])  # before any request
            result = engine.generate(REPETITIVE, max_tokens=40, temperature=0, ignore_eos=True)
        assert result.tokens == expected.tokens
        assert result.stats.cached_prompt_tokens == 0  # the warm-up's cells were dropped
    with Engine.load(tiny_model_path, draft="none", n_ctx=512, n_threads=1) as plain:
        plain.warm_up()  # nothing to calibrate without a drafter
        assert max(plain.learned().verify) == 0.0


def test_saved_memory_round_trips_and_bad_files_are_ignored(tmp_path: Path,
                                                             tiny_model_path: Path) -> None:
    with Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1) as engine:
        engine.generate(REPETITIVE, max_tokens=32, temperature=0, ignore_eos=True)
        memory = engine.learned()
        key = LearnedKey.of(engine.options)
    memory.timing_noise = 0.0  # as on a quiet machine (a noisy run's costs are not reused)
    path = learned_path(key, tmp_path)
    save_learned(path, memory)
    loaded = load_learned(path)
    assert loaded is not None
    assert (loaded.trials, loaded.hits, loaded.verify, loaded.draft_cost) == (
        memory.trials, memory.hits, memory.verify, memory.draft_cost)
    with Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1) as engine:
        engine.restore_learned(loaded)
        assert engine.learned().verify == memory.verify
    path.write_text("{not json")
    assert load_learned(path) is None
    assert load_learned(tmp_path / "missing.json") is None


def memory_with_noise(noise: float) -> _core.ControllerMemory:
    memory = _core.ControllerMemory()
    memory.trials, memory.hits = [[4.0, 2.0]] * 9, [[3.0, 1.0]] * 9
    memory.verify, memory.draft_cost = [0.0, 0.01, 0.012, 0.015], [0.001] * 9
    memory.evidence_trials, memory.evidence_hits = [30.0] * 9, [20.0] * 9
    memory.timing_noise = noise
    return memory


def test_statistics_saved_from_a_quiet_run_are_reused_and_say_when(tmp_path: Path) -> None:
    path = tmp_path / "quiet.json"
    save_learned(path, memory_with_noise(0.04))
    loaded = read_learned(path)
    assert loaded is not None
    memory, saved = loaded
    assert saved.timings_reused and memory.verify == [0.0, 0.01, 0.012, 0.015]
    assert memory.timing_noise == pytest.approx(0.04)
    assert saved.note().startswith("statistics from 20") and saved.note().endswith(" UTC reused")
    assert saved.to_dict()["timings_reused"] is True


def test_statistics_saved_from_a_noisy_run_keep_only_their_acceptance(tmp_path: Path) -> None:
    """Pass costs timed while other work shared the CPU are wrong for the next run: they are
    dropped (the engine times its passes afresh); acceptance, which no load changes, stays."""
    path = tmp_path / "noisy.json"
    save_learned(path, memory_with_noise(NOISY_TIMINGS + 0.2))
    loaded = read_learned(path)
    assert loaded is not None
    memory, saved = loaded
    assert not saved.timings_reused
    assert memory.verify == [0.0] * 4 and memory.draft_cost == [0.0] * 9
    assert memory.timing_noise == 0.0
    assert memory.trials == [[4.0, 2.0]] * 9 and memory.evidence_hits == [20.0] * 9
    assert "timings ignored (saved from a noisy run" in saved.note()
    data = json.loads(path.read_text())
    assert data["format"] == 2 and data["timing_noise"] > NOISY_TIMINGS
    data["format"] = 1  # a file of the format before: no date, no noise measure
    path.write_text(json.dumps(data))
    assert read_learned(path) is None


def test_the_key_changes_with_what_the_statistics_depend_on(tiny_model_path: Path,
                                                            tiny_draft_path: Path) -> None:
    base = LearnedKey(str(tiny_model_path), "ngram", True, 2, 4096)
    others = [LearnedKey(str(tiny_draft_path), "ngram", True, 2, 4096),
              LearnedKey(str(tiny_model_path), str(tiny_draft_path), True, 2, 4096),
              LearnedKey(str(tiny_model_path), "ngram", False, 2, 4096),
              LearnedKey(str(tiny_model_path), "ngram", True, 1, 4096),
              LearnedKey(str(tiny_model_path), "ngram", True, 2, 4096, fast_body=False)]
    assert len({base.digest(), *(k.digest() for k in others)}) == 6


def run_json(tmp_path: Path, model: Path, *extra: str) -> dict:
    env = {**os.environ, "LOCALSPEC_CACHE_DIR": str(tmp_path / "cache")}
    proc = run_localspec("run", REPETITIVE, "--target", str(model), "--draft", "ngram",
                         "--threads", "1", "--ctx", "512", "--max-tokens", "24",
                         "--temperature", "0", "--json", *extra, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_run_starts_from_the_statistics_of_earlier_runs(tmp_path: Path,
                                                        tiny_model_path: Path) -> None:
    first = run_json(tmp_path, tiny_model_path)
    assert first["saved_stats_used"] is False
    assert list((tmp_path / "cache" / "controller").glob("*.json"))
    second = run_json(tmp_path, tiny_model_path)
    assert second["saved_stats_used"] is True
    assert second["saved_stats"]["saved_at"].endswith("Z")
    assert second["tokens"] == first["tokens"]  # lossless either way
    reset = run_json(tmp_path, tiny_model_path, "--reset-stats")
    assert reset["saved_stats_used"] is False


def test_declined_lookups_are_checked_for_free(tiny_model_path: Path) -> None:
    """A fresh controller has no evidence, so it declines the n-gram proposals of a short
    request; each declined proposal is still compared with what the target then produced, and
    that is acceptance evidence gathered without a single drafted token."""
    with Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1) as engine:
        # Passes whose every row costs a whole pass (not this machine's measured costs, which
        # can make the probes cheap enough to keep drafting): the controller declines nearly
        # every proposal, whatever the machine's timing.
        steep = engine.learned()
        steep.verify = [0.0] + [0.01 * rows for rows in range(1, len(steep.verify))]
        engine.restore_learned(steep)
        result = engine.generate(REPETITIVE, max_tokens=48, temperature=0, ignore_eos=True)
        memory = engine.learned()
    # Drafting alone adds at most one trial per drafted token (and decay only shrinks them).
    assert sum(sum(row) for row in memory.trials[1:]) > result.stats.drafted + 1


def test_the_summary_line_names_the_statistics_it_started_from(tmp_path: Path,
                                                               tiny_model_path: Path) -> None:
    env = {**os.environ, "LOCALSPEC_CACHE_DIR": str(tmp_path / "cache")}
    args = ["run", REPETITIVE, "--target", str(tiny_model_path), "--draft", "ngram",
            "--threads", "1", "--ctx", "512", "--max-tokens", "16", "--temperature", "0"]
    first = run_localspec(*args, env=env)
    assert first.returncode == 0, first.stderr
    assert "statistics from" not in first.stderr
    second = run_localspec(*args, env=env)
    assert second.returncode == 0, second.stderr
    summary = next(line for line in second.stderr.splitlines() if line.startswith("["))
    # reused whole, or (from a run with noisy timings) its acceptance only: either is said
    assert summary.startswith("[16 tokens") and "| statistics from 20" in summary, summary
    assert summary.endswith(" UTC reused]") or summary.endswith("acceptance reused]"), summary
