"""A worker lost while a model loads over RPC (issue 22): one sentence naming the worker and
exit code 2 (RemoteWorkerError from Python), never an abort inside ggml, whether ggml was
connecting on the loading thread or uploading weights on its connection thread; and the same
process loads the model afterwards once the worker answers (docs/rpc.md)."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from localspec.errors import RemoteWorkerError
from localspec.runtime.engine import Engine
from localspec.testing.synthetic import TinyConfig, write_model
from tests.fixtures.rpc_workers import CuttingProxy, start_worker, workers
from tests.rpc.test_rpc_supervision import GREEDY, PROMPT, unread_bytes
from tests.server.test_server_cli import free_port

HANG_SECONDS = 120  # far above a load of the tiny model; only a load that never ends waits so long


def test_a_worker_gone_between_the_probe_and_the_load_is_an_error(
    tiny_model_path: Path,
) -> None:
    with workers(1) as [(_, endpoint)]:
        proxy = CuttingProxy(endpoint, connections=1)  # the probe gets through, ggml does not
        with pytest.raises(RemoteWorkerError,
                           match=f"RPC worker at {proxy.endpoint} stopped answering while"):
            Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1,
                        rpc=(proxy.endpoint,))
        with Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1,
                         rpc=(endpoint,)) as engine:  # the process lives on and loads
            assert len(engine.generate(PROMPT, **GREEDY).tokens) == GREEDY["max_tokens"]


def test_a_connection_cut_while_the_weights_upload_is_an_error(tiny_model_path: Path) -> None:
    with workers(1) as [(_, endpoint)]:
        proxy = CuttingProxy(endpoint, cut_after=64 * 1024)
        with pytest.raises(RemoteWorkerError, match=f"RPC worker at {proxy.endpoint}"):
            Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1,
                        rpc=(proxy.endpoint,))


def connected_to(endpoint: str) -> int:
    """The descriptor of this process's socket connected to ``endpoint`` (ggml's)."""
    host, port = endpoint.rsplit(":", 1)
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
        except OSError:  # the listing's own descriptor, closed by now
            continue
        with socket.socket(fileno=os.dup(fd)) as sock:
            try:
                if sock.getpeername() == (host, int(port)):
                    return fd
            except OSError:
                continue
    raise AssertionError(f"no connection to {endpoint}")


def test_a_cut_is_blamed_on_the_load_not_on_a_freed_models_worker(tiny_model_path: Path) -> None:
    """A model on one worker is used (the core finds ggml's socket and watches it), freed, and
    that worker stopped. Its descriptor number then holds a socket that names no peer (ggml
    leaks one whenever a worker refuses its connection). A load on another worker that loses
    its connection mid-upload is still that load's error: the freed model's worker is not
    taken for the lost one (the load then waited forever)."""
    with workers(2) as [(first, gone), (_, endpoint)]:
        proxy = CuttingProxy(endpoint, cut_after=64 * 1024)
        with Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1,
                         rpc=(gone,)) as engine:
            assert len(engine.generate(PROMPT, **GREEDY).tokens) == GREEDY["max_tokens"]
            number = connected_to(gone)
        first.kill()
        first.wait()
        with socket.socket() as refused:
            assert refused.connect_ex(("127.0.0.1", free_port())) != 0
            os.dup2(refused.fileno(), number)
        pool = ThreadPoolExecutor(1)  # a load that never ends fails the test, not the run
        try:
            load = pool.submit(Engine.load, tiny_model_path, draft="ngram", n_ctx=512,
                               n_threads=1, rpc=(proxy.endpoint,))
            with pytest.raises(RemoteWorkerError, match=f"RPC worker at {proxy.endpoint}"):
                load.result(timeout=HANG_SECONDS)
        finally:
            pool.shutdown(wait=False)
            os.close(number)


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc/net/tcp")
def test_a_worker_killed_while_run_loads_exits_2_with_one_sentence(tmp_path: Path) -> None:
    # Large enough that loading takes a while: the worker is stopped while it receives, then
    # killed.
    model = write_model(tmp_path / "wide.gguf",
                        TinyConfig(n_embd=384, n_head=6, n_head_kv=3, n_ff=1536, n_layer=6))
    worker, endpoint = start_worker()
    port = int(endpoint.rsplit(":", 1)[1])
    client = subprocess.Popen(
        [sys.executable, "-m", "localspec.cli", "run", "--target", str(model), "--draft", "ngram",
         "--rpc", endpoint, "--threads", "1", "--max-tokens", "4", "hello"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while unread_bytes(port) == 0:  # the load has sent work to the worker
            assert client.poll() is None and time.monotonic() < deadline, "never caught the load"
            time.sleep(0.002)
        worker.send_signal(signal.SIGSTOP)
        time.sleep(0.3)
    finally:
        worker.kill()
        worker.wait()
    _, stderr = client.communicate(timeout=60)
    print(stderr)
    assert client.returncode == 2
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("localspec: error: ")
    assert f"RPC worker at {endpoint}" in lines[0]
