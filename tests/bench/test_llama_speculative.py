"""`bench --baseline llama-speculative` (localspec/bench/llama_speculative.py): llama.cpp's
llama-speculative-simple run per arm and prompt, its log read into rows next to localspec's.

The program itself takes ~10 minutes to build (scripts/llama_speculative_build.py), so the
suite drives a stand-in that prints the log lines the real program prints (copied from a run
of the real program on the real pair) and records its arguments; where the real program is
built, one test runs it on the tiny model."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from localspec.bench import llama_speculative as ls
from localspec.bench.prompts import Prompt
from localspec.bench.report import Report, summarize
from localspec.bench.runner import PromptRun
from localspec.types import GenerationStats
from tests.fixtures.helpers import run_bench

# Lines of a real run (--spec-type draft-simple on the pair, 32 tokens, 2 threads), trimmed.
REAL_LOG = """\
0.02.806.484 I spec common_specu: adding speculative implementation 'draft-simple'
0.05.157.956 I encoded   20 tokens in    0.350 seconds, speed:   57.144 t/s
0.05.157.957 I decoded   36 tokens in    2.001 seconds, speed:   17.987 t/s
0.05.157.957 I
0.05.157.958 I n_draft   = 3
0.05.157.958 I n_predict = 36
0.05.157.958 I n_drafted = 30
0.05.157.958 I n_accept  = 26
0.05.157.958 I accept    = 86.667%
0.05.158.004 I spec common_specu: statistics     draft-simple: #calls(b,g,a) =    1     10     \
10, #gen drafts =     10, #acc drafts =     9, #gen tokens =     30, #acc tokens =    26, #mean \
acc len = 3.60, #acc rate/pos = (0.900, 0.900, 0.800), dur(b,g,a) = 0.000, 633.152, 0.009 ms
"""

FAKE = """#!{python}
import os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_ARGV_LOG"], "a") as log:
    log.write(repr(args) + "\\n")
if args[args.index("--spec-type") + 1] == "draft-simple":
    print("0.01.000.000 I decoded   20 tokens in    1.000 seconds, speed:   20.000 t/s",
          file=sys.stderr)
    print("0.01.000.000 I n_drafted = 6\\n0.01.000.000 I n_accept  = 5", file=sys.stderr)
    print("0.01.000.000 I statistics draft-simple: #calls(b,g,a) = 1 2 2, #gen drafts =     2,",
          file=sys.stderr)
else:
    print("0.01.000.000 I decoded   20 tokens in    4.000 seconds, speed:    5.000 t/s",
          file=sys.stderr)
    print("0.01.000.000 I n_drafted = 0\\n0.01.000.000 I n_accept  = 0", file=sys.stderr)
"""


@pytest.fixture
def fake_program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    program = tmp_path / "llama-speculative-simple"
    program.write_text(FAKE.format(python=sys.executable))
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("LOCALSPEC_LLAMA_SPECULATIVE", str(program))
    monkeypatch.setenv("FAKE_ARGV_LOG", str(tmp_path / "argv.log"))
    return tmp_path / "argv.log"


def test_a_real_log_gives_tokens_time_acceptance_and_verifying_passes() -> None:
    run = ls.parse_log(REAL_LOG)
    assert (run.tokens, run.seconds, run.drafted, run.accepted, run.passes) == \
        (36, 2.001, 30, 26, 10)
    with pytest.raises(ValueError, match="decoded"):
        ls.parse_log("error: failed to load model")


def test_without_a_draft_model_there_is_no_draft_model_arm() -> None:
    assert ls.arm_arguments("draft-simple", None) is None
    assert ls.arm_arguments("draft-simple", "d.gguf") == [
        "--spec-type", "draft-simple", "-md", "d.gguf", "--spec-draft-n-max", "3"]
    assert ls.arm_arguments("ngram-mod", "d.gguf") == ["--spec-type", "ngram-mod"]


def report_of_one_prompt() -> Report:
    """localspec's rows for one qa prompt: plain 16 tokens/s, speculative 24."""
    def stats(tps: float) -> GenerationStats:
        return GenerationStats(n_tokens=20, generation_seconds=20 / tps, tokens_per_second=tps,
                               target_passes=20)
    return summarize([PromptRun(Prompt("q1", "qa", "Why?"), [stats(16.0)], [stats(24.0)])])


def test_every_arm_runs_each_prompt_and_lines_up_with_localspecs_rows(fake_program: Path) -> None:
    report = report_of_one_prompt()
    seen: list[tuple[int, int]] = []
    prompts = [ls.SpecPrompt("q1", "qa", "Why?", 5)]
    result = ls.run_llama_speculative("t.gguf", "d.gguf", prompts, report,
                                      max_tokens=20, repeat=2, n_threads=1,
                                      also={"qa": 12.0, "all": 30.0},
                                      progress=lambda done, total: seen.append((done, total)))
    assert result.error is None
    row = result.categories[0]
    assert row.label == "qa" and set(row.arms) == {"draft-simple", "ngram-mod"}
    draft = row.arms["draft-simple"]
    assert draft.tokens_per_second == pytest.approx(20.0)
    assert draft.acceptance_rate == pytest.approx(5 / 6)
    assert draft.mean_accepted_length == pytest.approx((5 + 2) / 2)  # two verifying passes
    assert row.arms["ngram-mod"].tokens_per_second == pytest.approx(5.0)
    assert row.arms["ngram-mod"].mean_accepted_length == 0.0  # drafted nothing
    assert row.best_vs_best == pytest.approx(24.0 / 20.0)  # llama-cpp-python's 12 is slower
    assert result.overall is not None and result.overall.best_vs_best == pytest.approx(24 / 30)
    calls = [eval(line) for line in fake_program.read_text().splitlines()]  # noqa: S307
    assert len(calls) == 2 * 2  # repeats x arms
    first = calls[0]
    assert first[first.index("-m") + 1] == "t.gguf" and first[first.index("-p") + 1] == "Why?"
    assert first[first.index("-md") + 1] == "d.gguf"
    assert first[first.index("-n") + 1] == "20" and "--ignore-eos" in first
    # The context holds the prompt, the output and a draft's overshoot, not a fixed size.
    assert first[first.index("-c") + 1] == str(5 + 20 + ls.CONTEXT_MARGIN)
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert [c[c.index("--spec-type") + 1] for c in calls] == [
        "draft-simple", "ngram-mod", "ngram-mod", "draft-simple"]  # turns rotate


def test_a_run_whose_log_lost_its_last_lines_is_repeated(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp's logger may not flush before a short run exits: the run is tried again."""
    flaky = tmp_path / "flaky"
    count = tmp_path / "count"
    flaky.write_text(f"""#!{sys.executable}
from pathlib import Path
count = Path({str(count)!r})
n = int(count.read_text()) + 1 if count.exists() else 1
count.write_text(str(n))
if n >= 2:
    print("0.01.000.000 I decoded   12 tokens in    0.500 seconds, speed:   24.000 t/s")
""")
    flaky.chmod(0o755)
    run = ls.run_arm(flaky, ["--spec-type", "ngram-mod"], "t.gguf", "Why?", max_tokens=12,
                     n_threads=1, timeout=60, n_ctx=128)
    assert (run.tokens, count.read_text()) == (12, "2")
    count.write_text(str(-ls.TRIES))  # never reaches 2 within the tries: one sentence
    with pytest.raises(ValueError, match="decoded"):
        ls.run_arm(flaky, [], "t.gguf", "Why?", max_tokens=12, n_threads=1, timeout=60,
                   n_ctx=128)


def test_a_failing_program_gives_one_sentence(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'error: unknown argument' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("LOCALSPEC_LLAMA_SPECULATIVE", str(broken))
    report = report_of_one_prompt()
    prompts = [ls.SpecPrompt("q1", "qa", "Why?", 5)]
    result = ls.run_llama_speculative("t.gguf", None, prompts, report,
                                      max_tokens=20, repeat=1, n_threads=1)
    assert result.error is not None and "unknown argument" in result.error


def test_bench_says_in_one_sentence_that_the_program_is_not_built(
        tiny_model_path: Path, prompt_file: Path, tmp_path: Path) -> None:
    env = {**os.environ, "LOCALSPEC_LLAMA_SPECULATIVE": str(tmp_path / "absent")}
    proc = run_bench("--target", str(tiny_model_path), "--prompts", str(prompt_file),
                     "--max-tokens", "4", "--repeat", "1", "--baseline", "llama-speculative",
                     "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "is not built: run `python scripts/llama_speculative_build.py`" in \
        out["llama_speculative"]["error"]


@pytest.mark.skipif(ls.find_program() is None or "LOCALSPEC_LLAMA_SPECULATIVE" in os.environ,
                    reason="llama-speculative-simple is not built here")
def test_the_real_program_on_the_tiny_model(tiny_model_path: Path) -> None:
    program = ls.find_program()
    assert program is not None
    run = ls.run_arm(program, ["--spec-type", "ngram-mod"], str(tiny_model_path),
                     "one two three one two three one two", max_tokens=12, n_threads=1,
                     timeout=120, n_ctx=ls.context_size(10, 12))  # the prompt is ~9 tokens
    assert run.tokens >= 12 and run.seconds > 0
