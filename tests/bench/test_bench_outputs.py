"""`localspec bench` never loses a run: optional dependencies and output folders are checked
before any model loads, the JSON results are written before the PNG, and progress without a
terminal comes as lines with an ETA. The PNG names the model, drafter and machine and has an
"all" bar with its value."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from localspec.bench.progress import LineProgress, clock_text
from localspec.bench.prompts import Prompt
from localspec.bench.report import summarize
from localspec.bench.runner import PromptRun
from localspec.types import GenerationStats
from tests.fixtures.helpers import run_bench as bench


def no_matplotlib_env(tmp_path: Path) -> dict[str, str]:
    """An environment where `import matplotlib` fails, as on an install without the extra."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "matplotlib.py").write_text("raise ImportError('no matplotlib here')\n")
    return {**os.environ, "PYTHONPATH": str(fake)}


def test_plot_without_matplotlib_fails_before_loading_anything(tmp_path: Path) -> None:
    # The target does not exist: had the bench loaded it first, the error would be about that.
    proc = bench("--target", str(tmp_path / "missing.gguf"), "--plot", str(tmp_path / "b.png"),
                 env=no_matplotlib_env(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("localspec: error: --plot needs matplotlib, which is not "
                                   "installed: run pip install 'localspec[plot]' (or drop --plot).")


def test_output_folder_is_checked_first(tmp_path: Path) -> None:
    proc = bench("--target", str(tmp_path / "missing.gguf"), "--out",
                 str(tmp_path / "nowhere" / "r.json"))
    assert proc.returncode == 2 and "the folder" in proc.stderr and "does not exist" in proc.stderr


def test_results_file_progress_lines_and_png(tiny_model_path: Path, prompt_file: Path,
                                            tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    proc = bench("--target", str(tiny_model_path), "--draft", "ngram", "--prompts",
                 str(prompt_file), "--max-tokens", "8", "--repeat", "2", "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "bench.json").read_text())  # next to the PNG
    assert results["target"] == str(tiny_model_path) and results["overall"]["n_runs"] == 4
    assert png.read_bytes().startswith(b"\x89PNG")
    lines = [line for line in proc.stderr.splitlines() if line.startswith("bench: ")]
    assert lines[0].startswith("bench: 2 prompt(s) x 2 repeat(s) x 8 tokens x 3 arms")
    assert "= 96 tokens to generate" in lines[0]  # said before the first run
    assert lines[1].startswith("bench: 1/4 prompt runs") and "left" in lines[1]
    assert lines[-1].startswith("bench: 4/4 prompt runs") and "elapsed" in lines[-1]
    assert f"results written to {tmp_path / 'bench.json'}" in proc.stderr
    out = tmp_path / "r.json"
    proc = bench("--target", str(tiny_model_path), "--prompts", str(prompt_file),
                 "--max-tokens", "4", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text()) == json.loads(proc.stdout)


def test_a_failing_plot_keeps_the_results(tiny_model_path: Path, prompt_file: Path,
                                          tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    png.mkdir()  # a folder where the PNG should go: matplotlib cannot write it
    out = tmp_path / "results.json"
    proc = bench("--target", str(tiny_model_path), "--prompts", str(prompt_file),
                 "--max-tokens", "4", "--plot", str(png), "--out", str(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"the results are in {out}" in proc.stderr
    assert json.loads(out.read_text())["overall"]["label"] == "all"


def stats(n_tokens: int, seconds: float, passes: int) -> GenerationStats:
    return GenerationStats(n_tokens=n_tokens, generation_seconds=seconds, target_passes=passes,
                           tokens_per_second=n_tokens / seconds,
                           accepted_length_histogram=[passes])


def test_png_names_model_drafter_machine_and_has_an_all_bar() -> None:
    pytest.importorskip("matplotlib")
    from localspec.bench.plot import figure, machine

    runs = [PromptRun(Prompt("a", "code", "x"), [stats(10, 1.0, 10)], [stats(10, 0.5, 5)]),
            PromptRun(Prompt("b", "chat", "y"), [stats(10, 1.0, 10)], [stats(10, 1.0, 8)])]
    header = {"target": "/m/gemma.gguf", "drafter": "ngram", "max_tokens": 10, "repeat": 1,
              "temperature": 0.0, "draft_max": "auto"}
    fig = figure(summarize(runs), header)
    title = fig.get_suptitle()
    assert "gemma.gguf drafted by ngram" in title and machine() in title
    left = fig.axes[0]
    assert [t.get_text() for t in left.get_xticklabels()] == ["code", "chat", "all"]
    assert [t.get_text() for t in left.texts] == ["2.00x", "1.00x", "1.33x"]


def test_progress_lines_with_an_eta() -> None:
    now = [0.0]
    stream = io.StringIO()
    progress = LineProgress(stream, clock=lambda: now[0], min_interval=5.0)
    for done, at in ((1, 10.0), (2, 12.0), (3, 30.0), (4, 31.0)):
        now[0] = at
        progress.update(done, 4)
    assert stream.getvalue().splitlines() == [
        "bench: 1/4 prompt runs, 0:10 elapsed, about 0:30 left",
        "bench: 3/4 prompt runs, 0:30 elapsed, about 0:10 left",
        "bench: 4/4 prompt runs, 0:31 elapsed",
    ]
    assert clock_text(3725) == "1:02:05"


def test_same_pass_ratios_are_total_seconds_over_total_seconds() -> None:
    """--modes' "same passes" column: per category the first mode's replay seconds over the
    second's (second mode's speed), prompts without a timing counted apart, not averaged in."""
    from localspec.bench.modes import same_pass_ratios

    def run(pid: str, category: str, seconds: float | None) -> PromptRun:
        return PromptRun(Prompt(pid, category, "x"), same_pass_seconds=seconds)

    first = [run("a", "code", 2.0), run("b", "code", 1.0), run("c", "qa", 4.0), run("d", "qa", 1.0)]
    second = [run("a", "code", 1.0), run("b", "code", 2.0), run("c", "qa", 5.0),
              run("d", "qa", None)]
    ratios, skipped = same_pass_ratios(first, second)
    assert ratios == pytest.approx({"code": 3.0 / 3.0, "qa": 4.0 / 5.0, "all": 7.0 / 8.0})
    assert skipped == 1


def test_same_passes_take_the_median_of_one_replay_per_repeat() -> None:
    """Each mode replays each mode's schedule once per repeat, the modes' order alternating, and
    the median counts: one slow replay (a preempted pass) does not move the prompt's figure."""
    from localspec.bench import modes
    from localspec.types import GenerationParams, GenerationResult

    calls: list[tuple[str, int]] = []

    class Worker:
        def __init__(self, name: str, seconds: dict[int, list[float]]) -> None:
            self.name, self.seconds = name, seconds

        def replay(self, replay: modes._Replay) -> float:
            source = replay.prompt_tokens[0]
            calls.append((self.name, source))
            return self.seconds[source].pop(0)

    def run(source: int) -> PromptRun:
        schedule = GenerationResult("", [], [], "length", None, [1], [1])  # type: ignore[arg-type]
        return PromptRun(Prompt("p", "code", "x"), prompt_tokens=[source], schedule=schedule)

    workers = {"default": Worker("default", {0: [1.0, 9.0, 1.2], 1: [2.0, 2.2, 2.1]}),
               "exact": Worker("exact", {0: [1.1, 1.0, 1.3], 1: [2.5, 2.4, 8.0]})}
    merged = {"default": run(0), "exact": run(1)}
    modes._time_same_passes(workers, merged, Prompt("p", "code", "x"),  # type: ignore[arg-type]
                            GenerationParams(), rounds=3)
    assert merged["default"].same_pass_seconds == pytest.approx(1.2 + 2.1)
    assert merged["exact"].same_pass_seconds == pytest.approx(1.1 + 2.5)
    assert len(calls) == 12
    # Who replays first alternates, by round and by schedule.
    assert [calls[i][0] for i in (0, 2, 4, 6)] == ["default", "exact", "exact", "default"]


def test_nothing_drafted_shows_dashes_for_acceptance_and_tau() -> None:
    from rich.console import Console

    from localspec.bench.table import print_report

    drafting = stats(10, 0.5, 5)
    drafting.drafted, drafting.accepted = 8, 5
    drafting.mean_accepted_length = 2.0
    runs = [PromptRun(Prompt("a", "code", "x"), [stats(10, 1.0, 10)], [drafting]),
            PromptRun(Prompt("b", "chat", "y"), [stats(10, 1.0, 10)], [stats(10, 1.0, 10)])]
    console = Console(record=True, width=200)
    print_report(summarize(runs), console, per_prompt=False)
    rows = {line.split()[0]: line.split() for line in console.export_text().splitlines()
            if line.split() and line.split()[0] in ("code", "chat", "all")}
    assert rows["chat"][6:8] == ["-", "-"]  # accept %, tau: nothing was drafted
    assert rows["code"][6:8] == ["62%", "2.00"]
