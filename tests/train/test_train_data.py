"""train-head's steps that need no torch (localspec/train: data, self-distill split, packing,
draft vocabulary and d2t, the cache's shards, the GGUF writer), through the real tokenizer of a
tiny target and the real core. docs/train-head.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from localspec import _core
from localspec.bench.lossless import compare_greedy
from localspec.errors import InvalidParameterError
from localspec.runtime.engine import Engine
from localspec.testing.synthetic import CHAT_TEMPLATE, SPECIAL_TOKENS
from localspec.train import collect, data, vocab
from localspec.train.params import TrainHeadParams, head_shape, target_layers
from localspec.train.selfdistill import split_items
from localspec.train.write import TENSOR_NAMES, write_head
from localspec.types import GenerationParams


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path: Path) -> _core.FeatureCollector:
    return _core.FeatureCollector(str(tiny_model_path), [1, 2, 3], 256, 1)


def write_jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


def test_every_data_format(tmp_path: Path, tokenizer) -> None:
    text = tmp_path / "doc.txt"
    text.write_text("the quick brown fox jumps over the lazy dog.", encoding="utf-8")
    chat = [{"role": "user", "content": "hello world"}]
    lines = write_jsonl(tmp_path / "d.jsonl", [
        {"text": "the cat sat on the mat"},
        {"prompt": "once upon a time"},
        {"messages": chat},
        {"messages": [*chat, {"role": "assistant", "content": "the answer"}]},
        {"turns": ["first turn", "second turn"]},
    ])
    items = data.read_items([str(text), str(lines)], tokenizer)
    assert [i.is_prompt for i in items] == [False, False, True, True, False, True, True]
    bos = tokenizer.bos
    assert all(i.tokens[0] == bos for i in items)
    assert items[0].tokens == tuple(tokenizer.tokenize(text.read_text(), True, False))
    rendered = "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    assert items[3].tokens == tuple(tokenizer.tokenize(rendered, True, True))
    assert CHAT_TEMPLATE and "<|im_end|>" in SPECIAL_TOKENS  # the template the target carries
    end = tokenizer.tokenize("<|im_end|>", False, True)
    assert len(end) == 1 and end[0] in items[4].tokens  # special tokens parsed, not spelled
    second = "<|im_start|>user\nsecond turn<|im_end|>\n<|im_start|>assistant\n"
    assert items[6].tokens == tuple(tokenizer.tokenize(second, True, True))


@pytest.mark.parametrize(("line", "message"), [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "is not a JSON object"),
    ('{"question": "x"}', 'has none of "text", "prompt", "messages" or "turns"'),
    ('{"messages": [{"role": "user"}]}', 'must be a list of {"role", "content"} objects'),
    ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}", "nests its JSON too deeply"),
])
def test_bad_data_lines(tmp_path: Path, tokenizer, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(InvalidParameterError, match="line 2 of") as error:
        data.read_items([str(path)], tokenizer)
    assert message in str(error.value)


def test_missing_data_file(tmp_path: Path, tokenizer) -> None:
    with pytest.raises(InvalidParameterError, match="does not exist"):
        data.read_items([str(tmp_path / "nope.txt")], tokenizer)


def test_a_missing_data_file_leaves_no_cache(tmp_path: Path, tiny_model_path: Path) -> None:
    """Checked before the cache is made: a half-made cache used to block the next run."""
    out = tmp_path / "head.gguf"
    argv = [sys.executable, "-m", "localspec.cli", "train-head", "--target", str(tiny_model_path),
            "--data", str(tmp_path / "nope.jsonl"), "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "--data: cannot read" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("head.gguf*"))


def test_self_distill_split_and_packing() -> None:
    params = TrainHeadParams(target="t", data=("d",), out="o", self_distill=True,
                             prompt_tokens=4)
    items = [data.Item(tuple(range(1, 20)), False), data.Item((1, 7, 8), True),
             data.Item(tuple(range(1, 30)), False), data.Item(tuple(range(1, 6)), False)]
    texts, prompts = split_items(items, params)
    assert prompts == [(1, 7, 8), (1, 2, 3, 4)]  # the prompt, and the second text item cut
    assert texts == [list(range(1, 20)), list(range(1, 6))]
    plain = TrainHeadParams(target="t", data=("d",), out="o")
    assert split_items(items, plain) == ([list(i.tokens) for i in items], [])
    pieces = data.pack([list(range(100, 126)), list(range(7))], seq_len=10, bos=1)
    # Later pieces start with BOS again; pieces under 8 tokens are dropped.
    assert pieces == [list(range(100, 110)), [1, *range(110, 119)], [1, *range(119, 126)]]


def test_draft_vocabulary_and_d2t() -> None:
    labels = [np.array([5, 5, 5, 9, 9, 2, 7, 7, 7, 7], dtype=np.int32),
              np.array([2, 11], dtype=np.int32)]
    d2t = vocab.choose_vocab(labels, 3, 20)
    assert d2t.tolist() == [2, 5, 7]  # the three most frequent (ties: lower id), ascending
    assert vocab.choose_vocab(labels, 50, 20).tolist() == [2, 5, 7, 9, 11]  # all distinct
    t2d = vocab.target_to_draft(d2t, 20)
    assert t2d[7] == 2 and t2d[9] == -1
    assert vocab.coverage(np.array([2, 5, 9, 11], dtype=np.int32), d2t) == 0.5


def test_shard_plan_and_heldout() -> None:
    sequences = [[1] * 300, [1] * 300, [1] * 500, [1] * 10]
    assert collect.shard_plan(sequences, 600) == [range(0, 2), range(2, 4)]
    held = [i for i in range(100) if collect.is_heldout(i, 100, 0.05)]
    assert held == [19, 39, 59, 79, 99]
    assert [i for i in range(3) if collect.is_heldout(i, 3, 0.05)] == [2]


def test_too_small_a_disk(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match="MiB free; free some space"):
        collect.check_disk(tmp_path, 1 << 60)


def test_target_layers() -> None:
    assert target_layers(18) == (2, 9, 15)  # Gemma 3 270M
    assert target_layers(4) == (2, 2, 1)


def random_arrays(shape, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    e, qd, kd = shape.n_embd, shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    sizes = {"fc.weight": (e, shape.feature_width), "q.weight": (qd, 2 * e),
             "k.weight": (kd, 2 * e), "v.weight": (kd, 2 * e), "o.weight": (e, qd),
             "gate.weight": (shape.n_ff, e), "up.weight": (shape.n_ff, e),
             "down.weight": (e, shape.n_ff), "output.weight": (shape.n_draft, e)}
    out = {n: (rng.standard_normal(s) / np.sqrt(s[1])).astype(np.float32) for n, s in sizes.items()}
    out["output.weight"] *= 3
    for norm in ("attn_norm", "hidden_norm", "ffn_norm", "output_norm"):
        out[f"{norm}.weight"] = np.ones(e, dtype=np.float32)
    assert set(out) == set(TENSOR_NAMES)
    return out


@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
def test_written_head_loads_and_drafts_losslessly(tmp_path: Path, tiny_model_path: Path,
                                                   outtype: str) -> None:
    """The writer's GGUF (no torch involved) loads in llama.cpp's eagle3 loader through the
    core, carries its d2t, and drafts without changing the greedy output."""
    d2t = sorted(np.random.default_rng(1).choice(380, 100, replace=False).tolist())
    shape = head_shape(64, 128, 4, len(d2t), d2t)
    head = write_head(tmp_path / f"h-{outtype}.gguf", random_arrays(shape, 2), shape,
                      tiny_model_path, outtype)
    tokens = list(range(3, 20))
    features = _core.testing.layer_inputs(str(tiny_model_path), tokens, [2, 2, 1], False)
    probe = _core.eagle3_head_logits(str(tiny_model_path), str(head), tokens, features, [])
    assert probe["d2t"] == d2t
    greedy = GenerationParams(temperature=0.0, max_tokens=120, ignore_eos=True, draft_max=3)
    with Engine.load(tiny_model_path, draft="none", n_ctx=512) as plain, \
            Engine.load(tiny_model_path, draft=str(head), n_ctx=512, draft_p_min=0.0) as spec:
        prompt = "the quick brown fox"
        expected = plain.generate(prompt, greedy)
        got = spec.generate(prompt, greedy)
        divergence = compare_greedy(plain, plain.tokenize(prompt), expected.tokens, got)
        assert divergence is None or divergence.verdict == "tie", divergence
        assert got.stats.drafted > 100


def test_localspec_never_imports_torch() -> None:
    """`import localspec`, the command line's help and the train-head parser leave torch out."""
    code = (
        "import sys, contextlib, io\n"
        "import localspec, localspec.runtime.engine, localspec.train.pipeline\n"
        "from localspec.cli import main\n"
        "for argv in (['--help'], ['train-head', '--help'], ['run', '--help']):\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "        main(argv)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
