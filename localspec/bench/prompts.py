"""Benchmark prompt sets: the built-in one the project ships and users' own JSONL files.

Two line formats are accepted, one JSON object per line (blank lines are skipped):

* ``{"id": "summarization-03", "category": "summarization", "prompt": "..."}``
* MT-Bench style ``{"question_id": 81, "category": "writing", "turns": ["...", "..."]}``;
  only the first turn is used and the id is ``str(question_id)``.

``category`` may be left out (the prompt then counts as ``"uncategorized"``). An optional
``json_schema`` (a JSON Schema object) constrains that prompt's output: the bench applies it to
both arms and checks every output against it (the built-in ``structured`` set). Anything else
that is wrong with a line -- bad JSON, a missing or empty field, a duplicated id -- raises
:class:`~localspec.errors.LocalspecError` naming the file and the line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from localspec.errors import LocalspecError
from localspec.files import read_input_bytes
from localspec.text.grammar import json_schema_to_gbnf

BUILTIN_CATEGORIES: tuple[str, ...] = (
    "conversation",
    "translation",
    "summarization",
    "qa",
    "math",
    "retrieval",
    "code",
)
"""The categories of the built-in set, each with at least ten prompts."""

ADVERSARIAL_CATEGORIES: tuple[str, ...] = (
    "writing",
    "brainstorming",
    "roleplay",
    "poetry",
    "code-spec",
    "opinion",
)
"""The categories of the adversarial set: little in the prompt for the output to copy."""

DEFAULT_CATEGORY = "uncategorized"

BUILTIN_SETS: dict[str, str] = {"builtin": "prompts.jsonl", "adversarial": "adversarial.jsonl",
                                "structured": "structured.jsonl"}
"""Built-in prompt sets by name (files in localspec/data/)."""


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: a unique id, a category for per-category reports, the text, and
    the JSON Schema its output must follow (None: unconstrained). ``tokens``: the prompt as
    token ids when it was rendered through a chat template (``bench --chat``), else None;
    ``rendered``: then the template's text they were tokenized from (special tokens as text)."""

    id: str
    category: str
    text: str
    json_schema: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    tokens: tuple[int, ...] | None = field(default=None, compare=False, hash=False)
    rendered: str | None = field(default=None, compare=False, hash=False)  # the text of tokens

    @property
    def source(self) -> str | list[int]:
        """What the engine generates from: the token ids if rendered, else the text."""
        return list(self.tokens) if self.tokens is not None else self.text


def load_prompts(
    path: str | Path | None = None,
    categories: Sequence[str] | None = None,
    limit_per_category: int | None = None,
) -> list[Prompt]:
    """Read prompts from ``path`` (a JSONL file, or a name in BUILTIN_SETS), or the built-in
    set when ``path`` is None.

    ``categories`` keeps only prompts of those categories (file order is kept);
    ``limit_per_category`` keeps at most that many prompts of each category (the first ones).
    """
    if isinstance(categories, str):
        # A bare string is a Sequence[str] too; treat "code" as ("code",), not ("c", "o", ...).
        categories = (categories,)
    if limit_per_category is not None and (
        isinstance(limit_per_category, bool)
        or not isinstance(limit_per_category, int)
        or limit_per_category < 1
    ):
        raise LocalspecError(
            f"limit_per_category must be a positive integer, got {limit_per_category!r}."
        )

    source, text = _read_source(path)
    prompts = _parse(source, text)

    if categories is not None:
        wanted = list(dict.fromkeys(categories))
        available = list(dict.fromkeys(p.category for p in prompts))
        unknown = [c for c in wanted if c not in available]
        if unknown:
            raise LocalspecError(
                f"{source} has no prompts in categories {', '.join(map(repr, unknown))}; "
                f"its categories are {', '.join(available)}."
            )
        keep = set(wanted)
        prompts = [p for p in prompts if p.category in keep]

    if limit_per_category is not None:
        counts: dict[str, int] = {}
        limited: list[Prompt] = []
        for p in prompts:
            n = counts.get(p.category, 0)
            if n < limit_per_category:
                limited.append(p)
                counts[p.category] = n + 1
        prompts = limited

    return prompts


def _read_source(path: str | Path | None) -> tuple[str, str]:
    """(name used in error messages, file contents). ``path`` may name a built-in set."""
    if path is None or str(path) in BUILTIN_SETS:
        file_name = BUILTIN_SETS[str(path) if path is not None else "builtin"]
        name = f"built-in prompt set (localspec/data/{file_name})"
        resource = resources.files("localspec").joinpath("data", file_name)
        try:
            return name, resource.read_text(encoding="utf-8")
        except FileNotFoundError as exc:  # pragma: no cover - broken installation
            raise LocalspecError(
                f"The {name} is missing from the installed package; reinstall localspec."
            ) from exc

    file = Path(path)
    if not file.exists():
        raise LocalspecError(f"Prompt file {file} does not exist; check the path.")
    try:
        return str(file), read_input_bytes(file, "prompt file").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LocalspecError(
            f"Prompt file {file} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
            "save it as UTF-8 JSONL."
        ) from exc
    except OSError as exc:
        raise LocalspecError(f"Prompt file {file} cannot be read: {exc.strerror}.") from exc


def _parse(source: str, text: str) -> list[Prompt]:
    prompts: list[Prompt] = []
    first_line_of: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        prompt = _parse_line(source, lineno, line)
        if prompt.id in first_line_of:
            raise _line_error(
                source,
                lineno,
                f"duplicate id {prompt.id!r} (first used on line {first_line_of[prompt.id]}); "
                "give every prompt its own id",
            )
        first_line_of[prompt.id] = lineno
        prompts.append(prompt)
    if not prompts:
        raise LocalspecError(
            f"{source} contains no prompts; add one JSON object per line, "
            'e.g. {"id": "q1", "category": "qa", "prompt": "..."}.'
        )
    return prompts


def _parse_line(source: str, lineno: int, line: str) -> Prompt:
    try:
        obj: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _line_error(
            source, lineno, f"invalid JSON ({exc.msg} at column {exc.colno})"
        ) from exc
    if not isinstance(obj, dict):
        raise _line_error(source, lineno, f"expected a JSON object, got {type(obj).__name__}")

    if "prompt" in obj:
        text = obj["prompt"]
        if not isinstance(text, str):
            raise _line_error(
                source, lineno, f'"prompt" must be a string, got {type(text).__name__}'
            )
    elif "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns:
            raise _line_error(source, lineno, '"turns" must be a non-empty list of strings')
        text = turns[0]
        if not isinstance(text, str):
            raise _line_error(
                source, lineno, f'"turns"[0] must be a string, got {type(text).__name__}'
            )
    else:
        raise _line_error(source, lineno, 'missing field "prompt" (or "turns")')
    if not text.strip():
        raise _line_error(source, lineno, "empty prompt")

    key = "id" if "id" in obj else "question_id" if "question_id" in obj else None
    if key is None:
        raise _line_error(source, lineno, 'missing field "id" (or "question_id")')
    raw_id = obj[key]
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
        raise _line_error(source, lineno, f'"{key}" must be a string or an integer, got {raw_id!r}')
    prompt_id = str(raw_id).strip()
    if not prompt_id:
        raise _line_error(source, lineno, f'empty "{key}"')

    category = obj.get("category", DEFAULT_CATEGORY)
    if not isinstance(category, str) or not category.strip():
        raise _line_error(source, lineno, '"category" must be a non-empty string')

    return Prompt(id=prompt_id, category=category.strip(), text=text,
                  json_schema=_schema(source, lineno, obj.get("json_schema")))


def _schema(source: str, lineno: int, schema: Any) -> dict[str, Any] | None:
    """The line's JSON Schema, checked by converting it (None when the line has none)."""
    if schema is None:
        return None
    try:
        json_schema_to_gbnf(schema)
    except LocalspecError as exc:
        raise _line_error(source, lineno, f'"json_schema": {exc}') from None
    return dict(schema)


def _line_error(source: str, lineno: int, what: str) -> LocalspecError:
    return LocalspecError(
        f"{source}, line {lineno}: {what}; each line must be a JSON object like "
        '{"id": "q1", "category": "qa", "prompt": "..."} or '
        '{"question_id": 1, "category": "qa", "turns": ["..."]}.'
    )
