"""`localspec serve` as a user runs it (a subprocess), plus its safety defaults."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from localspec.cli import main
from localspec.commands.serve import DEFAULT_PARALLEL, _warn_if_exposed, start_line
from localspec.runtime.engine import Engine
from localspec.server import create_app
from localspec.server.background import BackgroundServer
from localspec.server.options import ServerOptions

STARTUP_SECONDS = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def served(tiny_model_path: Path, tiny_draft_path: Path) -> Iterator[str]:
    port = free_port()
    command = [
        sys.executable, "-m", "localspec.cli", "serve", "--target", str(tiny_model_path),
        "--draft", str(tiny_draft_path), "--port", str(port), "--ctx", "512",
        "--api-key", "cli-key", "--log-level", "warning", "--threads", "1",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, process)
        yield base
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_healthy(base: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = process.stderr.read() if process.stderr else ""
            raise AssertionError(f"serve exited early: {output}")
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("serve did not become healthy in time")


def test_serve_command_streams_a_chat_answer_with_statistics(served: str) -> None:
    client = openai.OpenAI(base_url=f"{served}/v1", api_key="cli-key", max_retries=0, timeout=30)
    model = client.models.list().data[0].id
    chunks = list(
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=12,
            stream=True, stream_options={"include_usage": True},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens > 0
    stats = (chunks[-1].model_extra or {})["localspec"]
    assert {"drafted", "accepted", "acceptance_rate", "mean_accepted_length"} <= set(stats)
    metrics = httpx.get(f"{served}/metrics", headers={"Authorization": "Bearer cli-key"}).text
    assert f"localspec_generated_tokens_total {float(usage.completion_tokens)}" in metrics


def test_greedy_answer_equals_localspec_run(
    served: str, tiny_model_path: Path, tiny_draft_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompt = "Once upon a time"
    code = main([
        "run", prompt, "--target", str(tiny_model_path), "--draft", str(tiny_draft_path),
        "--temperature", "0", "--max-tokens", "24", "--json", "--threads", "1",
    ])
    assert code == 0
    expected = json.loads(capsys.readouterr().out)
    client = openai.OpenAI(base_url=f"{served}/v1", api_key="cli-key", max_retries=0, timeout=30)
    model = client.models.list().data[0].id
    whole = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=24)
    assert whole.choices[0].text == expected["text"]
    streamed = client.completions.create(
        model=model, prompt=prompt, temperature=0, max_tokens=24, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == expected["text"]


def test_public_host_warns(capsys: pytest.CaptureFixture[str]) -> None:
    for host in ("127.0.0.1", "localhost", "::1"):
        _warn_if_exposed(host, None)
    assert capsys.readouterr().err == ""
    _warn_if_exposed("0.0.0.0", None)
    err = capsys.readouterr().err
    assert "WARNING" in err and "--api-key" in err
    _warn_if_exposed("0.0.0.0", "secret")
    assert "WARNING" in capsys.readouterr().err


def test_wildcard_cors_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--target", "x.gguf", "--cors-origin", "*"]) == 2
    assert "--cors-origin" in capsys.readouterr().err


def test_too_many_slots_are_refused_before_the_memory_plan(
        tiny_model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before, a memory plan for 1000 caches came first and asked for smaller quantizations.
    assert main(["serve", "--target", str(tiny_model_path), "--port", "0",
                 "--parallel", "1000"]) == 2
    assert "--parallel 1000 is invalid: use 1 to 64." in capsys.readouterr().err


def test_cors_only_for_named_origins(tiny_model_path: Path) -> None:
    allowed = "http://localhost:3000"
    with Engine.load(tiny_model_path, draft="none", n_ctx=128, n_threads=1) as engine:
        app = create_app(engine, ServerOptions(cors_origins=(allowed,)))
        with BackgroundServer(app) as server, httpx.Client(base_url=server.base_url) as http:
            preflight = {"Access-Control-Request-Method": "POST"}
            good = http.options("/v1/completions", headers={"Origin": allowed, **preflight})
            assert good.headers["access-control-allow-origin"] == allowed
            evil = {"Origin": "http://evil.test", **preflight}
            bad = http.options("/v1/completions", headers=evil)
            assert "access-control-allow-origin" not in bad.headers
        with BackgroundServer(create_app(engine)) as server:
            plain = httpx.get(f"{server.base_url}/v1/models", headers={"Origin": allowed})
            assert "access-control-allow-origin" not in plain.headers


def test_model_id_with_spaces_is_printed_and_its_slug_accepted(
        tiny_model_path: Path, tiny_draft_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A GGUF's general.name has spaces; clients may send it, its slug or the models.toml name.
    The start-up line says which, and the help's --parallel default is the one that runs."""
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"(default: {DEFAULT_PARALLEL}, with any drafter;" in help_text
    with Engine.load(tiny_model_path, draft=tiny_draft_path, n_ctx=256, n_threads=1,
                     parallel=DEFAULT_PARALLEL) as engine:
        app = create_app(engine, model_name="Tiny Target Model", aliases=("tiny-pair",))
        line = start_line(app.state.localspec, "http://127.0.0.1:1/v1")
        assert f"{DEFAULT_PARALLEL} at once" in line
        assert 'clients send "model": "Tiny Target Model"' in line
        assert "'tiny-target-model'" in line and "'tiny-pair'" in line
        with BackgroundServer(app) as running:
            client = openai.OpenAI(base_url=f"{running.base_url}/v1", api_key="x",
                                   max_retries=0, timeout=30)
            assert [m.id for m in client.models.list().data] == ["Tiny Target Model"]
            for model in ("Tiny Target Model", "tiny-target-model", "tiny-pair", "tiny-target"):
                done = client.completions.create(model=model, prompt="a", max_tokens=2)
                assert done.model == "Tiny Target Model"
            with pytest.raises(openai.NotFoundError):
                client.completions.create(model="tiny target model!", prompt="a", max_tokens=2)
