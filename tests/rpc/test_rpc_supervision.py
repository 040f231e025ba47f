"""A worker that dies under a loaded engine (issue 22, docs/rpc.md "How it works"): between two
passes, the check before the next pass reports it; in the middle of a pass, ggml's abort is
turned into a parked connection thread and the engine's watcher fails the request. Either way a
RemoteWorkerError naming the worker, never an abort; later requests fail the same way while the
worker does not answer, and once it answers again the engine loads the model again by itself."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from localspec import _core
from localspec.errors import RemoteWorkerError
from localspec.runtime.engine import Engine
from tests.fixtures.rpc_workers import start_worker, workers

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat"
GREEDY = {"max_tokens": 32, "temperature": 0.0, "ignore_eos": True}


def unread_bytes(port: int) -> int:
    """Bytes waiting in the receive queues of the worker's established connections (Linux's
    /proc/net/tcp): a stopped worker leaves a pass's requests there."""
    total = 0
    with open("/proc/net/tcp", encoding="ascii") as table:
        for line in list(table)[1:]:
            fields = line.split()
            local_port = int(fields[1].split(":")[1], 16)
            if local_port == port and fields[3] == "01":
                total += int(fields[4].split(":")[1], 16)
    return total


def test_a_worker_gone_between_passes_is_an_error_before_ggml_sees_it(
    tiny_model_path: Path,
) -> None:
    with workers(2) as started:
        (victim, killed), (_, other) = started
        engine = Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1,
                             rpc=(killed, other))
        before = engine.generate(PROMPT, **GREEDY)
        assert len(before.tokens) == GREEDY["max_tokens"]
        engine._stopped.set()  # the watcher off: the check before the pass must catch it
        victim.kill()
        victim.wait()
        with pytest.raises(RemoteWorkerError, match=f"RPC worker at {killed} closed"):
            engine.generate(PROMPT, **GREEDY)
        assert _core.rpc_failure([killed, other]) == ""  # no pass was left waiting
        engine.close()  # frees nothing on the workers (that would abort): returns


def test_a_worker_gone_while_idle_then_back_reloads_the_model(tiny_model_path: Path) -> None:
    with workers(2) as started:
        (victim, killed), (_, other) = started
        engine = Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1,
                             rpc=(killed, other))
        before = engine.generate(PROMPT, **GREEDY)
        lost_thread = engine._thread
        victim.kill()
        victim.wait()
        deadline = time.monotonic() + 30
        while engine.status != "worker_lost":  # the watcher polls ggml's connections
            assert time.monotonic() < deadline, "the watcher never noticed"
            time.sleep(0.05)
        assert killed in (engine.failure or "")
        assert lost_thread is not None
        lost_thread.join(30)  # its engine thread has ended ...
        assert not lost_thread.is_alive()
        # ... and the text helpers (a server tokenizes each request before it is refused with
        # a 503) still read its vocabulary
        assert engine.detokenize(engine.tokenize(PROMPT, add_special=False)) == PROMPT
        with pytest.raises(RemoteWorkerError, match=f"RPC worker at {killed}"):
            engine.generate("again", max_tokens=2)  # the probe finds nobody: still lost
        assert engine.status == "worker_lost"
        started[0] = start_worker(int(killed.rsplit(":", 1)[1]))
        after = engine.generate(PROMPT, **GREEDY)  # probes, loads again, serves
        assert after.tokens == before.tokens
        assert engine.status == "ok"
        engine.close()


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc/net/tcp")
def test_a_worker_lost_in_the_middle_of_a_pass_fails_the_request(tiny_model_path: Path) -> None:
    with workers(2) as started:
        (victim, killed), (_, other) = started
        engine = Engine.load(tiny_model_path, draft="ngram", n_ctx=512, n_threads=1,
                             rpc=(killed, other))
        victim.send_signal(signal.SIGSTOP)
        handle = engine.submit(PROMPT, **GREEDY)
        port = int(killed.rsplit(":", 1)[1])
        deadline = time.monotonic() + 60
        while unread_bytes(port) == 0:  # the pass has sent its work to the stopped worker
            assert time.monotonic() < deadline, "the pass never reached the worker"
            time.sleep(0.02)
        victim.kill()
        victim.wait()
        with pytest.raises(RemoteWorkerError, match=f"RPC worker at {killed}"):
            handle.result(timeout=60)
        assert killed in _core.rpc_failure([killed, other])  # lost mid-pass, not before one
        with pytest.raises(RemoteWorkerError, match=killed):  # the probe finds nobody
            engine.submit("again", max_tokens=2).result(timeout=60)
        engine.close()  # the engine thread stays blocked in that pass; close returns anyway
