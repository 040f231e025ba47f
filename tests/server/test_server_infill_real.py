"""/infill on the real Qwen2.5-Coder 1.5B (tests/conftest.py, real_pair: skipped without the
coder extra)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from localspec.runtime.engine import Engine
from localspec.server import create_app
from localspec.server.background import BackgroundServer
from localspec.server.prepare import Preparer
from localspec.server.schemas import InfillRequest

# Qwen2.5-Coder's vocabulary: <|fim_prefix|>, <|fim_middle|>, <|fim_suffix|>, <|repo_name|>,
# <|file_sep|> (its tokenizer_config.json)
FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, REPO_NAME, FILE_SEP = 151659, 151660, 151661, 151663, 151664


@pytest.fixture(scope="module")
def served(real_pair: Any) -> Iterator[tuple[BackgroundServer, Preparer]]:
    engine = Engine.load(real_pair.target, draft="ngram", n_ctx=1024, n_threads=2)
    app = create_app(engine)
    with BackgroundServer(app) as running:
        yield running, app.state.localspec.preparer
    engine.close()


def test_the_real_coder_fills_in_the_middle(served: tuple[BackgroundServer, Preparer]) -> None:
    server, preparer = served
    body = {"input_prefix": "def add(a, b):\n    return a",
            "input_suffix": "\n\nprint(add(1, 2))\n",
            "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
            "n_predict": 6, "temperature": 0, "n_indent": 4}
    tokens = preparer.infill(InfillRequest.model_validate(body)).tokens
    assert tokens[0] == REPO_NAME and tokens.count(FILE_SEP) == 2
    assert [t for t in tokens if t in (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE)] == [
        FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE]
    assert tokens[-1] == FIM_MIDDLE
    answer = httpx.post(f"{server.base_url}/infill", json=body, timeout=120).json()
    assert answer["content"].lstrip().startswith("+ b"), answer["content"]
    assert answer["tokens_evaluated"] == len(tokens)
