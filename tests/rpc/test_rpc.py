"""A target spread over two `localspec rpc-worker` processes on loopback (issue 22, docs/rpc.md):
the same greedy output as the single-process run, plain and speculative; the memory plan per
remote device; bad --rpc values and unreachable workers as one sentence with exit code 2."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.cli import main
from localspec.errors import InvalidParameterError, LocalspecError, RemoteWorkerError
from localspec.models.registry import load_registry
from localspec.planning.remote import split_layers
from localspec.runtime.engine import Engine
from localspec.runtime.loading import LoadOptions
from tests.fixtures.rpc_workers import wait_listening, workers
from tests.server.test_server_cli import free_port

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat"
# A fixed draft length: with "auto" the controller may decline to draft over loopback RPC,
# whose pass costs depend on the machine's load, and the test would check nothing.
GREEDY = {"max_tokens": 48, "temperature": 0.0, "ignore_eos": True, "draft_max": 4}


@pytest.fixture(scope="module")
def endpoints() -> Iterator[tuple[str, str]]:
    with workers(2) as started:
        yield started[0][1], started[1][1]


def generate(model: Path, drafter: str, rpc: tuple[str, ...] = ()) -> tuple[list[int], str]:
    with Engine.load(model, draft=drafter, n_ctx=512, n_threads=1, rpc=rpc) as engine:
        result = engine.generate(PROMPT, **GREEDY)
        return result.tokens, engine.info.verify_head


@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_output_over_two_workers_equals_the_single_process_run(
    tiny_model_path: Path, endpoints: tuple[str, str], drafter: str,
    capfd: pytest.CaptureFixture[str],
) -> None:
    alone, _ = generate(tiny_model_path, drafter)
    with Engine.load(tiny_model_path, draft=drafter, n_ctx=512, n_threads=1, rpc=endpoints,
                     verbose=True) as engine:
        spread = engine.generate(PROMPT, **GREEDY)
    log = capfd.readouterr().err
    # llama.cpp's load log: both remote devices hold target weights.
    assert all(f"[{endpoint}] model buffer size" in log for endpoint in endpoints)
    # ... split as localspec plan says (two workers with the same free memory).
    assigned = re.findall(r"layer +(\d+) assigned to device (RPC\d+)", log)
    devices = sorted({device for _, device in assigned})
    split = split_layers(len(assigned), [1, 1])
    assert [devices.index(device) for _, device in assigned] == [
        index for index, r in enumerate(split) for _ in r]
    assert spread.tokens == alone
    if drafter == "ngram":
        assert spread.stats.accepted > 0  # speculation really ran over the workers


def test_localspec_output_head_stays_local(
    q8_head_model: Path, endpoints: tuple[str, str]
) -> None:
    alone, head = generate(q8_head_model, "ngram")
    spread, spread_head = generate(q8_head_model, "ngram", endpoints)
    assert head == spread_head == "localspec-q8_0"  # the output layer is in local memory
    assert spread == alone


def test_plan_shows_each_remote_device(
    tiny_model_path: Path, endpoints: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--target", str(tiny_model_path), "--rpc", ",".join(endpoints)]) == 0
    out = capsys.readouterr().out
    for endpoint in endpoints:  # ggml numbers RPC devices per process: RPC0, RPC1, then RPC2 ...
        line = next(line for line in out.splitlines() if re.search(rf"RPC\d+ at {endpoint}:", line))
        assert "free; layer" in line and line.endswith("fits")
    assert "local: the input embeddings, the output layer and the drafter" in out


@pytest.mark.parametrize("value, says", [
    ("nonsense", "is not HOST:PORT"),
    ("127.0.0.1:0", "no port from 1 to 65535"),
    ("127.0.0.1:99999", "no port from 1 to 65535"),
    ("127.0.0.1:5000,127.0.0.1:5000", "named twice"),
])
def test_bad_rpc_values_exit_2_with_one_sentence(
    tiny_model_path: Path, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--target", str(tiny_model_path), "--threads", "1", "--rpc", value, "hi"])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --rpc" in error and says in error


def test_an_unreachable_worker_exits_2_before_anything_loads(
    tiny_model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    code = main(["run", "--target", str(tiny_model_path), "--threads", "1", "--rpc", nobody, "hi"])
    error = capsys.readouterr().err.strip()
    assert code == 2 and len(error.splitlines()) == 1
    assert f"cannot reach the RPC worker at {nobody}" in error and "rpc-worker" in error


def test_load_options_own_the_rule() -> None:
    with pytest.raises(InvalidParameterError, match="rpc="):
        LoadOptions(target="t.gguf", rpc=("localhost",)).validate()
    LoadOptions(target="t.gguf", rpc=("localhost:50052", "10.0.0.2:50052")).validate()
    for kv_type in ("f16", "f32"):  # a worker's attention over them is not batch-invariant
        with pytest.raises(InvalidParameterError, match="add --kv-type q8_0"):
            LoadOptions(target="t.gguf", rpc=("localhost:50052",), exact=True,
                        kv_type=kv_type).validate()
    LoadOptions(target="t.gguf", rpc=("localhost:50052",), exact=True, kv_type="q8_0").validate()
    LoadOptions(target="t.gguf", exact=True, kv_type="f16").validate()  # no workers: any cache


def test_a_busy_worker_is_a_clear_error(tiny_model_path: Path) -> None:
    """A worker serves one client at a time: a second process's probe says so (timeout)."""
    with workers(1) as started:
        endpoint = started[0][1]
        with Engine.load(tiny_model_path, draft="none", n_ctx=256, n_threads=1, rpc=(endpoint,)):
            other = subprocess.run(
                [*_cli(), "run", "--target", str(tiny_model_path), "--threads", "1", "--rpc",
                 endpoint, "hi"], capture_output=True, text=True, timeout=120)
    assert other.returncode == 2
    assert "serves one client at a time" in other.stderr.strip().splitlines()[-1]


def test_remote_worker_error_is_http_503() -> None:
    assert RemoteWorkerError("x").status_code == 503


def _cli() -> list[str]:
    import sys

    return [sys.executable, "-m", "localspec.cli"]


def test_a_build_without_rpc_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from localspec import _core

    monkeypatch.setattr(_core, "rpc_supported", lambda: False)
    assert main(["rpc-worker", "--port", str(free_port())]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert 'CMAKE_ARGS="-DGGML_RPC=on"' in error and "llama-cpp-python==0.3.36" in error


def test_split_layers_is_llama_cpps_rule() -> None:
    # n_layer + 1 slots (the output layer last) in proportion to free memory.
    assert split_layers(5, [1, 1]) == [range(0, 3), range(3, 5)]
    assert split_layers(18, [3, 1]) == [range(0, 15), range(15, 18)]
    assert split_layers(4, [1, 1, 1, 1, 1]) == [range(0, 1), range(1, 2), range(2, 3),
                                                 range(3, 4), range(0)]


def test_a_models_toml_pair_takes_rpc(tmp_path: Path) -> None:
    user = tmp_path / "models.toml"
    pair = '[pairs.spread]\ntarget = "t.gguf"\n'
    user.write_text(pair + 'rpc = ["10.0.0.2:50052", "10.0.0.3:50052"]\n')
    assert load_registry(user).pair("spread").rpc == ("10.0.0.2:50052", "10.0.0.3:50052")
    user.write_text(pair + 'rpc = ["10.0.0.2"]\n')
    with pytest.raises(LocalspecError, match=r"\[pairs.spread\] rpc = \['10.0.0.2'\] is invalid"):
        load_registry(user)


def test_a_worker_on_a_non_loopback_address_warns() -> None:
    port = free_port()
    worker = subprocess.Popen([*_cli(), "rpc-worker", "--host", "0.0.0.0", "--port", str(port),
                               "--threads", "1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        wait_listening(port, worker)  # everything it says before serving has been said
    finally:
        worker.kill()
        lines = worker.communicate()[1].splitlines()
    warning, banner = lines[0], lines[1]
    assert "no authentication and no encryption" in warning and "trusted network" in warning
    assert f"at 0.0.0.0:{port}" in banner
    # A CPU device computes without llama.cpp's repacked layouts there (docs/rpc.md).
    assert "CPU" not in banner or "--no-repack" in lines[2]


def test_bench_compares_the_workers_with_this_machine_alone(
    tiny_model_path: Path, endpoints: tuple[str, str], prompt_file: Path
) -> None:
    """--modes local,rpc: the same prompts with and without the workers, interleaved in one run,
    each mode with its own speedup over plain decoding, and rpc / local per arm (docs/rpc.md)."""
    proc = subprocess.run(
        [*_cli(), "bench", "--target", str(tiny_model_path), "--draft", "ngram", "--threads", "1",
         "--max-tokens", "16", "--repeat", "2", "--prompts", str(prompt_file), "--json",
         "--rpc", ",".join(endpoints), "--modes", "local,rpc"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    local, remote = out["modes"]["local"], out["modes"]["rpc"]
    assert "rpc" not in local and remote["rpc"] == list(endpoints)
    for mode in (local, remote):
        assert mode["overall"]["n_runs"] == 2 * len(mode["prompts"])
        assert mode["overall"]["identical"] == "yes"
    plain = out["rpc_vs_local"]["plain"]["overall"]
    assert plain == pytest.approx(remote["overall"]["plain_tps"] / local["overall"]["plain_tps"],
                                  rel=1e-6)


def test_bench_local_rpc_needs_workers(tiny_model_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--target", str(tiny_model_path), "--threads", "1",
                 "--modes", "local,rpc"])
    error = capsys.readouterr().err.strip()
    assert code == 2 and len(error.splitlines()) == 1
    assert "--modes local,rpc compares RPC workers with this machine alone" in error
