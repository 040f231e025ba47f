"""`localspec train-head` end to end on a tiny target (real llama.cpp, real torch): a few
hundred tokens train a head whose loss falls, whose GGUF loads in the core and drafts without
changing the greedy output; an interrupted run resumes shard by shard and from its checkpoint;
every user error is one sentence and exit code 2. docs/train-head.md."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")

from localspec.bench.draft_agreement import HeadQ  # noqa: E402
from localspec.bench.lossless import compare_greedy  # noqa: E402
from localspec.errors import InvalidParameterError  # noqa: E402
from localspec.runtime.engine import Engine  # noqa: E402
from localspec.testing.recurrent import write_mamba_model  # noqa: E402
from localspec.testing.synthetic import TinyConfig, write_model  # noqa: E402
from localspec.train import collect, pipeline, train  # noqa: E402
from localspec.train.params import TrainHeadParams  # noqa: E402
from localspec.types import GenerationParams  # noqa: E402
from tests.fixtures.helpers import length_one_counts, run_localspec  # noqa: E402

WORDS = ("the quick brown fox jumps over the lazy dog and the cat sat on the mat while "
         "speculative decoding drafts tokens that the target model verifies in one batch").split()


def text_file(path: Path, n_words: int, seed: int = 0) -> Path:
    """Word salad from the tiny vocabulary's corpus, in paragraphs."""
    import random

    rng = random.Random(seed)
    paragraphs = [" ".join(rng.choice(WORDS) for _ in range(60)) for _ in range(n_words // 60)]
    path.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> Path:
    tmp = tmp_path_factory.mktemp("train")
    data = text_file(tmp / "words.txt", 720)
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": " ".join(WORDS[i:i + 6])})
                                 for i in range(0, 24, 6)) + "\n", encoding="utf-8")
    out = tmp / "head.gguf"
    proc = run_localspec("train-head", "--target", str(tiny_model_path), "--data", str(data),
                         str(prompts), "--out", str(out), "--draft-vocab", "96", "--tokens",
                         "1500", "--steps", "24", "--self-distill", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stdout and "self-distill" in proc.stderr
    return out


def test_the_loss_falls_and_the_run_is_reported(trained: Path) -> None:
    report = json.loads((trained.with_name(trained.name + ".cache") / "report.json").read_text())
    assert report["depth"] >= 3 and report["steps"] == 24
    assert report["last_loss"] < 0.95 * report["first_loss"]
    assert report["self_distilled_tokens"] > 0
    evaluation = report["evaluation"]
    assert len(evaluation["acceptance_by_position"]) == 8 and evaluation["drafted"] > 0
    assert len(evaluation["teacher_forced"]) == report["depth"]
    assert evaluation["c"] > 0 and len(evaluation["v"]) == 9
    assert set(report["seconds"]) == {"prepare", "collect", "vocab", "train", "write",
                                      "evaluate"}


def test_the_trained_head_drafts_losslessly(trained: Path, tiny_model_path: Path) -> None:
    greedy = GenerationParams(temperature=0.0, max_tokens=150, ignore_eos=True, draft_max=4)
    prompt = "the quick brown fox jumps over the"
    with Engine.load(tiny_model_path, draft="none", n_ctx=512) as plain, \
            Engine.load(tiny_model_path, draft=f"eagle3:{trained}", n_ctx=512,
                        draft_p_min=0.0) as spec:
        expected = plain.generate(prompt, greedy)
        got = spec.generate(prompt, greedy)
        divergence = compare_greedy(plain, plain.tokenize(prompt), expected.tokens, got)
        assert divergence is None or divergence.verdict == "tie", divergence
        assert got.stats.drafted > 0


def test_the_check_diagnostic_reads_the_rows_the_head_drafts_from(trained: Path,
                                                                    tiny_model_path: Path) -> None:
    """`check`'s q rows for a head (localspec.bench.draft_agreement) are the ones the drafter takes
    its
    first token from: walking the plain output with draft length 1 (an accepted draft moves two
    positions on, a rejected one, one) and accepting where argmax q == argmax p reproduces the
    engine's counts exactly."""
    n, text = 200, "the quick brown fox jumps over the"
    greedy = GenerationParams(temperature=0.0, max_tokens=n, ignore_eos=True, draft_max=1)
    with Engine.load(tiny_model_path, draft="none", n_ctx=512) as plain, \
            Engine.load(tiny_model_path, draft=str(trained), n_ctx=512, draft_p_min=0.0) as spec:
        result = spec.generate(text, greedy)
        prompt = plain.tokenize(text)
        tokens = prompt + result.tokens
        p = plain.pass_logits(tokens, len(tokens))[:-1]
    q, start, ids = HeadQ(str(tiny_model_path), str(trained), 1).rows(tokens)
    drafted, accepted = length_one_counts(p, q, start, ids, len(prompt) - 1, n)
    assert (result.stats.drafted, result.stats.accepted) == (drafted, accepted)
    assert 0 < accepted < drafted


class Interrupt(Exception):
    pass


def bars(stop_at: tuple[str, int] | None) -> Callable[[str], object]:
    """Progress bars that raise Interrupt when step `name` reaches `done` (an interruption)."""
    @contextmanager
    def bar(name: str) -> Iterator[Callable[[int, int], None]]:
        def update(done: int, total: int) -> None:
            if stop_at is not None and name == stop_at[0] and done >= stop_at[1]:
                raise Interrupt(name)

        yield update

    return bar


def test_an_interrupted_run_resumes(tmp_path: Path, tiny_model_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train, "CHECKPOINT_EVERY", 2)
    params = TrainHeadParams(target=str(tiny_model_path), data=(str(text_file(
        tmp_path / "w.txt", 1200)),), out=str(tmp_path / "h.gguf"), tokens=1300, steps=6,
        draft_vocab=64, n_threads=1, shard_tokens=500, eval_prompts=1, eval_tokens=8)
    cache = params.cache_dir
    with pytest.raises(Interrupt):  # during collection, after the first shard
        pipeline.run(params, print, bars(("collect", 1)))
    first = collect.shard_path(cache, 0)
    stamp = first.stat().st_mtime_ns
    assert not collect.shard_path(cache, 1).exists()
    with pytest.raises(InvalidParameterError, match="pass --resume to continue it"):
        pipeline.run(params, print, bars(None))
    resumed = replace(params, resume=True)
    with pytest.raises(Interrupt):  # during training, after the checkpoint of step 2
        pipeline.run(resumed, print, bars(("train", 3)))
    assert first.stat().st_mtime_ns == stamp and collect.shard_path(cache, 1).exists()
    steps = []
    report = pipeline.run(resumed, print, lambda name: recording(steps, name))
    assert steps[0] == 3 and steps[-1] == 6  # continued after step 2's checkpoint
    assert report.steps == 6 and Path(params.out).exists()
    assert first.stat().st_mtime_ns == stamp
    other = replace(resumed, draft_vocab=32)
    with pytest.raises(InvalidParameterError, match="another target, data or settings"):
        pipeline.run(other, print, bars(None))


@contextmanager
def recording(steps: list[int], name: str) -> Iterator[Callable[[int, int], None]]:
    yield lambda done, total: steps.append(done) if name == "train" else None


def test_too_small_a_disk(tmp_path: Path, tiny_model_path: Path,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.disk_usage
    monkeypatch.setattr(collect.shutil, "disk_usage",
                        lambda path: real(path)._replace(free=1 << 20))
    params = TrainHeadParams(target=str(tiny_model_path), data=(str(text_file(
        tmp_path / "w.txt", 600)),), out=str(tmp_path / "h.gguf"), n_threads=1)
    with pytest.raises(InvalidParameterError, match="MiB free; free some space"):
        pipeline.run(params, print, bars(None))


def assert_one_sentence(proc, fragment: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert fragment in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_data_too_small(tmp_path: Path, tiny_model_path: Path) -> None:
    data = tmp_path / "tiny.txt"
    data.write_text("the quick brown fox", encoding="utf-8")
    proc = run_localspec("train-head", "--target", str(tiny_model_path), "--data", str(data),
                         "--out", str(tmp_path / "h.gguf"), "--threads", "1")
    assert_one_sentence(proc, "train-head needs at least 200 tokens in 2 sequences")


def test_targets_a_head_cannot_read(tmp_path: Path) -> None:
    data = text_file(tmp_path / "w.txt", 600)
    mamba = write_mamba_model(tmp_path / "mamba.gguf")
    proc = run_localspec("train-head", "--target", str(mamba), "--data", str(data), "--out",
                         str(tmp_path / "h.gguf"), "--threads", "1")
    assert_one_sentence(proc, "a head cannot help it")
    shallow = write_model(tmp_path / "one-layer.gguf", TinyConfig(n_layer=1))
    proc = run_localspec("train-head", "--target", str(shallow), "--data", str(data), "--out",
                         str(tmp_path / "h.gguf"), "--threads", "1")
    assert_one_sentence(proc, "the target needs at least 2 layers")


def test_missing_torch(tmp_path: Path, tiny_model_path: Path) -> None:
    """Without the train extra: the install command, before anything runs."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import sys\n"
        "class HideTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, HideTorch())\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": f"{hide}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = run_localspec("train-head", "--target", str(tiny_model_path), "--data",
                         str(text_file(tmp_path / "w.txt", 600)), "--out",
                         str(tmp_path / "h.gguf"), env=env)
    assert_one_sentence(proc, "pip install 'localspec[train]'")
    assert not (tmp_path / "h.gguf.cache").exists()
