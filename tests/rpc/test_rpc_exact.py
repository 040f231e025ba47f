"""Exact mode over RPC workers (docs/exact.md, "Over RPC workers"): a worker started with
`localspec rpc-worker --exact` computes rows that do not depend on the pass's size, the client
measures that when it loads, and speculative output equals plain output over the worker. A
worker without --exact is refused at load with one sentence."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from localspec import _core
from localspec.bench.invariance import differing_row_counts
from localspec.bench.prompts import load_prompts
from localspec.cli import main
from localspec.errors import InvalidParameterError
from localspec.runtime.engine import Engine
from localspec.testing.synthetic import TinyConfig, write_model
from localspec.types import GenerationParams
from tests.fixtures.rpc_workers import workers
from tests.server.test_server_cli import free_port

# Q4_K weights of realistic width: ggml's tiled K-quant matmul takes passes of 8+ rows there.
WIDE = TinyConfig(n_embd=1024, n_head=8, n_head_kv=4, n_ff=2048, seed=13)
TEXT = " ".join(p.text for p in load_prompts(limit_per_category=1))


@pytest.fixture(scope="module")
def q4k_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("rpc-exact")
    f32 = write_model(directory / "wide-f32.gguf", WIDE, name="wide")
    out = directory / "wide-Q4_K_M.gguf"
    _core.quantize(str(f32), str(out), "Q4_K_M", 2)
    return out


def load(model: Path, endpoint: str) -> Engine:
    return Engine.load(model, draft="ngram", n_ctx=2048, n_threads=1, rpc=(endpoint,),
                       exact=True, kv_type="q8_0")


def test_an_exact_worker_gives_batch_invariant_rows_and_plain_output(q4k_model: Path) -> None:
    with workers(1, exact=True) as started, load(q4k_model, started[0][1]) as engine:
        assert engine.info.exact and engine.info.rpc == (started[0][1],)
        tokens = engine.tokenize(TEXT * 4)
        # 600: past the 512-entry split a worker's F16 attention would take
        assert [differing_row_counts(engine, tokens[:n]) for n in (48, 600)] == [[], []]
        greedy = GenerationParams(max_tokens=48, temperature=0.0, ignore_eos=True)
        for prompt in load_prompts(limit_per_category=1)[:3]:
            plain = engine.generate(prompt.text, greedy, speculative=False).tokens
            for k in ("auto", 3, 15):
                assert engine.generate(prompt.text, greedy, draft_max=k).tokens == plain


def test_a_worker_without_exact_is_refused_at_load(q4k_model: Path) -> None:
    with workers(1) as started:
        endpoint = started[0][1]
        with pytest.raises(InvalidParameterError, match="rpc-worker --exact") as refused:
            load(q4k_model, endpoint)
        assert "passes of 8 rows" in str(refused.value) or ", 8" in str(refused.value)
        # the command line: exit code 2, one sentence, and the worker serves the next client
        proc = subprocess.run(
            [sys.executable, "-m", "localspec.cli", "run", "--target", str(q4k_model), "--rpc",
             endpoint, "--exact", "--kv-type", "q8_0", "--threads", "1", "hello"],
            capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert "rpc-worker --exact" in proc.stderr and "Traceback" not in proc.stderr
        with Engine.load(q4k_model, draft="none", n_ctx=256, n_threads=1, rpc=(endpoint,)) as ok:
            assert ok.generate("hello", max_tokens=4).tokens


def test_exact_worker_lends_cpu_devices_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rpc-worker", "--exact", "--device", "CUDA0", "--port", str(free_port())]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "--exact lends CPU devices only" in error[0]
