"""Training text for a head: plain text files and JSONL, tokenized as the target reads them.

A JSONL line is one of ``{"text": ...}`` (text), ``{"prompt": ...}`` (a prompt),
``{"messages": [{"role", "content"}, ...]}`` (a chat, rendered with the target's chat template
through localspec.text.chat_template: text when it ends with the assistant, else a prompt for its
reply) or ``{"turns": [...]}`` (user turns; each becomes a one-turn chat prompt). Any other file
is plain text: one document. Prompts are what ``--self-distill`` continues; without it they are
trained on as they are. No torch here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from localspec.errors import InvalidParameterError
from localspec.text.chat_template import render_chat

JSONL_SUFFIXES = (".jsonl", ".ndjson")


class Tokenizer(Protocol):
    """What data preparation needs of the target (``_core.FeatureCollector`` has it)."""

    bos: int
    eos: int

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]: ...
    def token_text(self, token: int) -> str: ...
    def chat_template(self) -> str: ...


@dataclass(frozen=True)
class Item:
    """One piece of training data: tokens as the target reads them (BOS included)."""

    tokens: tuple[int, ...]
    is_prompt: bool  # a prompt (or chat awaiting a reply) that self-distill may continue


def read_items(paths: Sequence[str], tokenizer: Tokenizer) -> list[Item]:
    """Every item of every file, in order."""
    items: list[Item] = []
    for name in paths:
        path = Path(name)
        if not path.is_file():
            raise InvalidParameterError(
                f"The data file '{path}' does not exist or is not a file; check the path.")
        if path.suffix.lower() in JSONL_SUFFIXES:
            for record, where in _records(path):
                items += _items(record, tokenizer, where)
        else:
            text = path.read_text(encoding="utf-8", errors="replace")
            if text.strip():
                items.append(Item(tuple(tokenizer.tokenize(text, True, False)), False))
    return [item for item in items if len(item.tokens) >= 2]


def _records(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"line {number} of '{path}'"
        try:
            record = json.loads(line)
        except ValueError:
            raise InvalidParameterError(
                f"{where} is not valid JSON; write one JSON object per line.") from None
        except RecursionError:
            raise InvalidParameterError(
                f"{where} nests its JSON too deeply; write one flat object per line.") from None
        if not isinstance(record, dict):
            raise InvalidParameterError(f"{where} is not a JSON object; write one per line.")
        yield record, where


def _items(record: dict[str, Any], tokenizer: Tokenizer, where: str) -> list[Item]:
    if isinstance(record.get("text"), str):
        return [Item(tuple(tokenizer.tokenize(record["text"], True, False)), False)]
    if isinstance(record.get("prompt"), str):
        return [Item(tuple(tokenizer.tokenize(record["prompt"], True, False)), True)]
    if isinstance(record.get("messages"), list):
        return [_chat(record["messages"], tokenizer, where)]
    if isinstance(record.get("turns"), list) and record["turns"]:
        return [_chat([{"role": "user", "content": str(turn)}], tokenizer, where)
                for turn in record["turns"]]
    raise InvalidParameterError(
        f"{where} has none of \"text\", \"prompt\", \"messages\" or \"turns\"; use one of "
        "these formats (docs/train-head.md).")


def _chat(messages: list[Any], tokenizer: Tokenizer, where: str) -> Item:
    if not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in messages):
        raise InvalidParameterError(
            f"{where}: \"messages\" must be a list of {{\"role\", \"content\"}} objects.")
    awaiting_reply = messages[-1]["role"] != "assistant"
    bos = tokenizer.token_text(tokenizer.bos) if tokenizer.bos >= 0 else ""
    eos = tokenizer.token_text(tokenizer.eos) if tokenizer.eos >= 0 else ""
    text = render_chat(tokenizer.chat_template(), messages, bos_token=bos, eos_token=eos,
                       add_generation_prompt=awaiting_reply)
    add_bos = not (bos and text.startswith(bos))
    return Item(tuple(tokenizer.tokenize(text, add_bos, True)), awaiting_reply)


def pack(sequences: Sequence[Sequence[int]], seq_len: int, bos: int) -> list[list[int]]:
    """Cut each token sequence into pieces of at most seq_len tokens; a piece after the first
    starts with BOS again (each piece is its own target context). Pieces under 8 tokens go."""
    out: list[list[int]] = []
    for tokens in sequences:
        start = 0
        while start < len(tokens):
            lead = [bos] if start > 0 and bos >= 0 else []
            piece = lead + list(tokens[start:start + seq_len - len(lead)])
            start += len(piece) - len(lead)
            if len(piece) >= 8:
                out.append(piece)
    return out
