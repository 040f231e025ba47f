"""The built-in benchmark prompt set and the JSONL prompt loader."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from localspec.bench.prompts import BUILTIN_CATEGORIES, Prompt, load_prompts
from localspec.errors import LocalspecError

REQUIRED = {"conversation", "translation", "summarization", "qa", "math", "retrieval", "code"}


def _write(tmp_path: Path, lines: list[str], name: str = "prompts.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- the built-in set -------------------------------------------------------------------------


def test_builtin_categories_constant() -> None:
    assert set(BUILTIN_CATEGORIES) == REQUIRED
    assert len(BUILTIN_CATEGORIES) == len(REQUIRED)


def test_builtin_has_ten_prompts_per_category() -> None:
    prompts = load_prompts()
    counts = Counter(p.category for p in prompts)
    assert set(counts) == REQUIRED
    for category in REQUIRED:
        assert counts[category] >= 10, (category, counts[category])


def test_builtin_ids_unique_and_text_nonempty() -> None:
    prompts = load_prompts()
    ids = [p.id for p in prompts]
    assert len(ids) == len(set(ids))
    for p in prompts:
        assert isinstance(p, Prompt)
        assert p.text.strip(), p.id
        assert re.fullmatch(rf"{re.escape(p.category)}-\d\d", p.id), p.id
        assert len(p.text.split()) <= 700, p.id


def test_builtin_context_categories_carry_real_passages() -> None:
    # n-gram drafting needs text to copy from: every summarization/retrieval prompt holds a
    # passage of 150-400 words (plus a short instruction and question).
    for p in load_prompts(categories=["summarization", "retrieval"]):
        words = len(p.text.split())
        assert 150 <= words <= 460, (p.id, words)
    for p in load_prompts(categories=["retrieval"]):
        assert "\nQuestion:" in p.text and p.text.rstrip().endswith("Answer:"), p.id


def test_builtin_file_is_read_through_package_resources() -> None:
    # The same file, read directly, gives the same prompts: the loader uses the package data.
    path = Path(__file__).resolve().parents[2] / "localspec" / "data" / "prompts.jsonl"
    assert load_prompts(path) == load_prompts()


# --- formats ----------------------------------------------------------------------------------


def test_loads_simple_format(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            json.dumps({"id": "a", "category": "qa", "prompt": "Question: 1+1?\nAnswer:"}),
            "",  # blank lines are skipped
            json.dumps({"id": 7, "category": "code", "prompt": "def f():\n"}),
        ],
    )
    prompts = load_prompts(path)
    assert prompts == [
        Prompt(id="a", category="qa", text="Question: 1+1?\nAnswer:"),
        Prompt(id="7", category="code", text="def f():\n"),
    ]


def test_loads_mt_bench_format_using_first_turn(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            json.dumps(
                {
                    "question_id": 81,
                    "category": "writing",
                    "turns": ["Write a travel blog post.", "Rewrite it in one sentence."],
                }
            ),
            json.dumps({"question_id": 82, "category": "math", "turns": ["What is 3*4?"]}),
        ],
    )
    prompts = load_prompts(str(path))  # str paths work too
    assert prompts == [
        Prompt(id="81", category="writing", text="Write a travel blog post."),
        Prompt(id="82", category="math", text="What is 3*4?"),
    ]


def test_missing_category_defaults_to_uncategorized(tmp_path: Path) -> None:
    path = _write(tmp_path, [json.dumps({"id": "x", "prompt": "Hello"})])
    assert load_prompts(path) == [Prompt(id="x", category="uncategorized", text="Hello")]


# --- errors -----------------------------------------------------------------------------------

GOOD = json.dumps({"id": "ok", "category": "qa", "prompt": "fine"})


@pytest.mark.parametrize(
    ("bad_line", "what"),
    [
        ('{"id": "b", "category": "qa", "prompt": "unterminated', "invalid JSON"),
        ('["not", "an", "object"]', "expected a JSON object"),
        (json.dumps({"id": "b", "category": "qa"}), 'missing field "prompt"'),
        (json.dumps({"category": "qa", "prompt": "text"}), 'missing field "id"'),
        (json.dumps({"id": "b", "category": "qa", "prompt": ""}), "empty prompt"),
        (json.dumps({"id": "b", "category": "qa", "prompt": "  \n "}), "empty prompt"),
        (json.dumps({"id": "b", "category": "qa", "prompt": 5}), '"prompt" must be a string'),
        (json.dumps({"question_id": 1, "category": "qa", "turns": []}), '"turns" must be'),
        (json.dumps({"question_id": 1, "category": "qa", "turns": [""]}), "empty prompt"),
        (json.dumps({"question_id": 1, "category": "qa", "turns": [3]}), '"turns"[0] must'),
        (json.dumps({"id": "", "category": "qa", "prompt": "x"}), 'empty "id"'),
        (json.dumps({"id": None, "category": "qa", "prompt": "x"}), '"id" must be'),
        (json.dumps({"id": "b", "category": "", "prompt": "x"}), '"category" must be'),
        (json.dumps({"id": "ok", "category": "qa", "prompt": "again"}), "duplicate id 'ok'"),
    ],
)
def test_malformed_line_names_file_line_and_problem(
    tmp_path: Path, bad_line: str, what: str
) -> None:
    path = _write(tmp_path, [GOOD, "", bad_line, GOOD.replace('"ok"', '"later"')])
    with pytest.raises(LocalspecError) as info:
        load_prompts(path)
    message = str(info.value)
    assert str(path) in message
    assert "line 3:" in message  # blank lines still count
    assert what in message


def test_duplicate_id_names_first_line(tmp_path: Path) -> None:
    path = _write(tmp_path, [GOOD, GOOD])
    with pytest.raises(LocalspecError, match=r"line 2: duplicate id 'ok' \(first used on line 1\)"):
        load_prompts(path)


@pytest.mark.parametrize("content", ["", "\n\n   \n"])
def test_empty_file_is_an_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(LocalspecError, match="contains no prompts") as info:
        load_prompts(path)
    assert str(path) in str(info.value)


def test_missing_file_and_directory_are_errors(tmp_path: Path) -> None:
    with pytest.raises(LocalspecError, match="does not exist"):
        load_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(LocalspecError, match="not a regular file"):
        load_prompts(tmp_path)


def test_non_utf8_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": "a", "prompt": "caf\xe9"}\n')
    with pytest.raises(LocalspecError, match="not UTF-8"):
        load_prompts(path)


# --- filtering --------------------------------------------------------------------------------


def test_category_filter_keeps_file_order(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            json.dumps({"id": f"p{i}", "category": cat, "prompt": f"text {i}"})
            for i, cat in enumerate(["qa", "code", "qa", "math", "code"])
        ],
    )
    assert [p.id for p in load_prompts(path, categories=["code", "qa"])] == [
        "p0",
        "p1",
        "p2",
        "p4",
    ]
    assert [p.id for p in load_prompts(path, categories="math")] == ["p3"]


def test_limit_per_category(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            json.dumps({"id": f"p{i}", "category": cat, "prompt": f"text {i}"})
            for i, cat in enumerate(["qa", "code", "qa", "qa", "code", "math"])
        ],
    )
    assert [p.id for p in load_prompts(path, limit_per_category=1)] == ["p0", "p1", "p5"]
    assert [p.id for p in load_prompts(path, categories=["qa"], limit_per_category=2)] == [
        "p0",
        "p2",
    ]


def test_builtin_filter_and_limit() -> None:
    prompts = load_prompts(categories=["summarization", "code"], limit_per_category=3)
    assert Counter(p.category for p in prompts) == {"summarization": 3, "code": 3}
    assert len(load_prompts(limit_per_category=2)) == 2 * len(BUILTIN_CATEGORIES)


def test_unknown_category_is_an_error() -> None:
    with pytest.raises(LocalspecError, match="no prompts in categories 'sumarization'"):
        load_prompts(categories=["sumarization"])


@pytest.mark.parametrize("limit", [0, -1, True, 1.5])
def test_bad_limit_is_an_error(limit: object) -> None:
    with pytest.raises(LocalspecError, match="limit_per_category"):
        load_prompts(limit_per_category=limit)  # type: ignore[arg-type]
