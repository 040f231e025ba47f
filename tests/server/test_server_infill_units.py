"""/infill's stop rules (localspec.server.infill.LineStop) and request checks, without a model."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from localspec.errors import InvalidParameterError
from localspec.server.infill import LineStop
from localspec.server.schemas import InfillRequest
from localspec.types import Chunk, GenerationStats


def chunk(text: str, seconds: float = 0.0) -> Chunk:
    return Chunk(text, [1], ["target"], GenerationStats(generation_seconds=seconds))


def feed(rule: LineStop, pieces: list[str], seconds: float = 0.0) -> str:
    sent = ""
    for piece in pieces:
        sent += rule.see(chunk(piece, seconds)).text
        if rule.stopped:
            break
    return sent


def test_n_indent_cuts_a_line_left_of_the_block_keeping_its_indentation() -> None:
    rule = LineStop(n_indent=4, t_max_predict_ms=0)
    sent = feed(rule, ["x = 1\n", "    y = 2\n", "  ", "  z\n", "w = 3\n", "more"])
    assert rule.stopped and sent == rule.text == "x = 1\n    y = 2\n    z\n"
    rule = LineStop(n_indent=4, t_max_predict_ms=0)
    sent = feed(rule, ["a\n    b\nreturn c\n"])  # one step of several lines
    assert rule.stopped and sent == "a\n    b\n"


def test_n_indent_waits_for_a_lines_first_character_and_ignores_the_first_line() -> None:
    rule = LineStop(n_indent=2, t_max_predict_ms=0)
    assert feed(rule, ["top level", "\n", " "]) == "top level\n " and not rule.stopped
    assert rule.see(chunk("x")).text == "" and rule.stopped
    assert rule.text == "top level\n "
    rule = LineStop(n_indent=2, t_max_predict_ms=0)
    assert feed(rule, ["a\n", "\n"]) == "a\n" and rule.stopped  # an empty line is left of it


def test_t_max_predict_ms_stops_at_the_first_newline_past_the_time() -> None:
    rule = LineStop(n_indent=0, t_max_predict_ms=50)
    assert rule.see(chunk("one\ntwo", seconds=0.01)).text == "one\ntwo" and not rule.stopped
    assert rule.see(chunk(" more", seconds=0.06)).text == " more" and not rule.stopped
    assert rule.see(chunk("!\nthree\nfour", seconds=0.07)).text == "!\n" and rule.stopped
    assert rule.text == "one\ntwo more!\n"


def test_n_predict_zero_sends_nothing_and_rules_off_pass_everything() -> None:
    rule = LineStop(0, 0, keep_nothing=True)
    assert rule.see(chunk("x")).text == "" and rule.stopped
    off = LineStop(0, 0)
    assert not off.active and off.see(chunk("a\nb")).text == "a\nb" and not off.stopped


def test_infill_request_checks() -> None:
    vscode_chunk = {"text": "t", "time": 1, "filename": "a.py"}  # extra keys are ignored
    assert InfillRequest.model_validate({"input_extra": [vscode_chunk]}).input_extra[0].text == "t"
    for bad in ("x", [1], [{"filename": "a"}], [{"text": 1}], [{"text": "t", "filename": 2}]):
        with pytest.raises(ValidationError, match="filename.*text"):
            InfillRequest.model_validate({"input_extra": bad})
    for field, value in (("input_prefix", 5), ("n_predict", "9"), ("n_indent", True),
                         ("t_max_predict_ms", 1.5), ("prompt", ["a"])):
        with pytest.raises(ValidationError) as excinfo:
            InfillRequest.model_validate({field: value})
        assert excinfo.value.errors()[0]["loc"][0] == field
    with pytest.raises(ValidationError, match="lora"):
        InfillRequest.model_validate({"lora": [{"id": 0, "scale": 0.5}]})
    for field, value in (("n_predict", -2), ("n_indent", -1), ("n_cmpl", 0)):
        with pytest.raises(InvalidParameterError, match=field):
            InfillRequest.model_validate({field: value}).check_supported()
    assert InfillRequest.model_validate({"n_predict": 7, "max_tokens": 3}).token_limit() == 7
    assert InfillRequest.model_validate({"n_predict": -1}).token_limit() is None
