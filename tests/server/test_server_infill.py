"""Fill-in-the-middle end to end: POST /infill (llama.cpp's shapes, llama.vscode's request) and
``suffix`` on /v1/completions, on a real server over a tiny generated model that has Qwen's FIM
tokens, and a 400 on one without them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from localspec.runtime.engine import Engine
from localspec.server import create_app
from localspec.server.background import BackgroundServer
from localspec.testing.synthetic import TinyConfig, write_model

PREFIX = "def main():\n    the quick brown"
SUFFIX = "\n    return 42\n"
EXTRA = [{"filename": "notes.py", "text": "the cat sat on the mat", "time": 1700000000}]
GREEDY = {"temperature": 0, "n_predict": 24}


@pytest.fixture(scope="module")
def fim_engine(model_dir: Path) -> Iterator[Engine]:
    path = write_model(model_dir / "tiny-fim.gguf", TinyConfig(fim=True), name="tiny-fim")
    # exact mode: speculative output is bit-identical to plain decoding, so equal is equal
    loaded = Engine.load(path, draft="ngram", n_ctx=1024, n_threads=1, exact=True)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def server(fim_engine: Engine) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(fim_engine)) as running:
        yield running


@pytest.fixture(scope="module")
def plain_server(tiny_model_path: Path) -> Iterator[BackgroundServer]:
    engine = Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1)
    with BackgroundServer(create_app(engine)) as running:
        yield running
    engine.close()


def fim(engine: Engine, name: str) -> int:
    return next(t for t in range(engine.info.n_vocab) if engine.token_text(t) == name)


def text_tokens(engine: Engine, text: str) -> list[int]:
    return engine.tokenize(text, add_special=False, parse_special=False)


def expected_prompt(engine: Engine, prefix: str, suffix: str, prompt: str = "",
                    extra: list[dict[str, Any]] | None = None) -> list[int]:
    """Qwen2.5-Coder's repo-level FIM layout, spelt out token by token."""
    tokens = [*engine.tokenize("", add_special=True), fim(engine, "<|repo_name|>"),
              *text_tokens(engine, "myproject\n")]
    for chunk in extra or []:
        tokens += [fim(engine, "<|file_sep|>"), *text_tokens(engine, chunk["filename"] + "\n"),
                   *text_tokens(engine, chunk["text"])]
    tokens += [fim(engine, "<|file_sep|>"), *text_tokens(engine, "filename\n"),
               fim(engine, "<|fim_prefix|>"), *text_tokens(engine, prefix),
               *text_tokens(engine, prompt), fim(engine, "<|fim_suffix|>"),
               *text_tokens(engine, suffix), fim(engine, "<|fim_middle|>")]
    return tokens


def infill(server: BackgroundServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.base_url}/infill", json=body, timeout=30)


def test_llama_vscode_request_gets_llama_cpp_answer(server: BackgroundServer,
                                                    fim_engine: Engine) -> None:
    """Exactly the fields llama.vscode's FIM request sends (src/llama-server.ts), no model."""
    body = {
        "id_slot": 0, "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA,
        "prompt": " fox", "n_predict": 16, "n_cmpl": 3, "top_k": 40, "top_p": 0.99,
        "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
        "n_indent": 4, "t_max_prompt_ms": 500, "t_max_predict_ms": 1000,
    }
    response = infill(server, body)
    assert response.status_code == 200, response.text
    answer = response.json()
    expected = expected_prompt(fim_engine, PREFIX, SUFFIX, " fox", EXTRA)
    assert answer["stop"] is True and isinstance(answer["content"], str)
    assert answer["tokens_evaluated"] == len(expected)
    assert answer["prompt"] == fim_engine.detokenize(expected)
    assert 1 <= answer["tokens_predicted"] <= 16
    assert answer["stop_type"] in ("eos", "limit", "word")
    assert answer["generation_settings"]["n_indent"] == 4
    timings = answer["timings"]
    assert timings["predicted_n"] == answer["tokens_predicted"]
    assert timings["prompt_n"] + timings["cache_n"] == len(expected)
    assert answer["localspec"]["drafter"] == "ngram"
    # its warm-up request, sent when the extra context changes: prefill only, nothing back
    warm_up = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": EXTRA,
               "prompt": "", "n_predict": 0, "samplers": [], "cache_prompt": True,
               "t_max_prompt_ms": 500, "t_max_predict_ms": 1}
    warm = infill(server, warm_up)
    assert warm.status_code == 200, warm.text
    assert warm.json()["content"] == "" and warm.json()["tokens_predicted"] == 0


def test_greedy_infill_is_the_plain_completion_of_the_fim_prompt(
        server: BackgroundServer, fim_engine: Engine) -> None:
    expected = expected_prompt(fim_engine, PREFIX, SUFFIX, "", EXTRA)
    plain = fim_engine.generate(expected, temperature=0, max_tokens=24, speculative=False)
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": EXTRA, **GREEDY}
    speculative = infill(server, body).json()
    without = infill(server, {**body, "speculative": False}).json()
    assert speculative["content"] == without["content"] == plain.text
    assert speculative["tokens_predicted"] == len(plain.tokens)
    assert without["localspec"]["speculative"] is False
    tokens = infill(server, {**body, "return_tokens": True}).json()["tokens"]
    assert tokens == plain.tokens


def test_streamed_infill_sends_llama_cpp_chunks_and_a_final_object(
        server: BackgroundServer) -> None:
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, **GREEDY}
    whole = infill(server, body).json()
    with httpx.stream("POST", f"{server.base_url}/infill", json={**body, "stream": True},
                      timeout=30) as response:
        assert response.status_code == 200
        events = [line[len("data: "):] for line in response.iter_lines()
                  if line.startswith("data: ")]
    assert "[DONE]" not in events
    bodies = [json.loads(e) for e in events]
    assert all(b["stop"] is False for b in bodies[:-1]) and bodies[-1]["stop"] is True
    assert "".join(b["content"] for b in bodies) == whole["content"]
    assert bodies[-1]["content"] == "" and bodies[-1]["timings"]["predicted_n"] > 0


def test_line_stops_end_the_completion_where_llama_cpp_does(server: BackgroundServer) -> None:
    """A grammar forces the lines, so the stops have something to act on."""
    lines = 'root ::= "' + "a" * 60 + '\\n    b\\nc\\n" [a-z]*'
    body = {"input_prefix": "x", "input_suffix": "", "temperature": 0, "n_predict": 90,
            "grammar": lines}
    free = infill(server, body).json()
    assert free["content"].startswith("a" * 60 + "\n    b\nc\n")
    indented = infill(server, {**body, "n_indent": 2}).json()
    assert indented["content"] == "a" * 60 + "\n    b\n"
    assert indented["stop_type"] == "limit" and indented["has_new_line"] is True
    # one token a step: the generation itself ends at the token that broke the rule
    plain = {**body, "speculative": False}
    cut = infill(server, {**plain, "n_indent": 2}).json()
    assert cut["tokens_predicted"] < infill(server, plain).json()["tokens_predicted"]
    # one token a step (no forced drafts): 60 steps take more than 1 ms
    timed = infill(server, {**body, "t_max_predict_ms": 1, "speculative": False}).json()
    assert timed["content"] == "a" * 60 + "\n" and timed["stop_type"] == "limit"
    warm = infill(server, {**body, "n_predict": 0}).json()  # llama.vscode's cache warm-up
    assert warm["content"] == "" and warm["tokens_predicted"] == 0


def test_suffix_on_v1_completions_builds_the_same_fim_prompt(
        server: BackgroundServer, fim_engine: Engine) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
    result = client.completions.create(model="tiny-fim", prompt=PREFIX, suffix=SUFFIX,
                                       max_tokens=24, temperature=0)
    expected = expected_prompt(fim_engine, PREFIX, SUFFIX)
    plain = fim_engine.generate(expected, temperature=0, max_tokens=24, speculative=False)
    assert result.choices[0].text == plain.text
    assert result.usage is not None and result.usage.prompt_tokens == len(expected)
    with pytest.raises(openai.BadRequestError, match="token ids"):
        client.completions.create(model="tiny-fim", prompt=[1, 2, 3], suffix="x", max_tokens=4)


@pytest.mark.parametrize(("body", "param"), [
    ({"input_extra": "notes"}, "input_extra"),
    ({"input_extra": [{"filename": "a.py"}]}, "input_extra"),
    ({"input_extra": [{"text": "t", "filename": 7}]}, "input_extra"),
    ({"input_prefix": 3}, "input_prefix"),
    ({"input_suffix": None}, "input_suffix"),
    ({"n_predict": "lots"}, "n_predict"),
    ({"n_predict": -5}, "n_predict"),
    ({"t_max_predict_ms": "1s"}, "t_max_predict_ms"),
    ({"lora": [{"id": 0, "scale": 0.5}]}, "lora"),
    ({"model": "gpt-4"}, "model"),
])
def test_bad_infill_requests_get_a_400_naming_the_parameter(
        server: BackgroundServer, body: dict[str, Any], param: str) -> None:
    response = infill(server, {"input_prefix": "a", "input_suffix": "b", **body})
    assert response.status_code in (400, 404), response.text
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"]


def test_a_model_without_fim_tokens_gets_a_400(plain_server: BackgroundServer) -> None:
    response = infill(plain_server, {"input_prefix": "a", "input_suffix": "b"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert "fill-in-the-middle tokens" in error["message"] and error["param"] == "input_prefix"
    client = openai.OpenAI(base_url=f"{plain_server.base_url}/v1", api_key="none",
                           max_retries=0)
    with pytest.raises(openai.BadRequestError, match="fill-in-the-middle tokens"):
        client.completions.create(model="tiny-target", prompt="a", suffix="b", max_tokens=4)
