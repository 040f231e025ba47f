"""Run an app with uvicorn on a background thread (notebooks, tests, embedding).

    with BackgroundServer(create_app(engine)) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")

The socket is bound before the thread starts (port 0 picks a free port without a race). The
server runs with the same limits and shutdown as `localspec serve` (localspec.server.runner).
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

from fastapi import FastAPI

from localspec.server.options import ServerOptions
from localspec.server.runner import GracefulServer, bind, drain_hook, server_config

START_TIMEOUT_SECONDS = 10.0


class BackgroundServer:
    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        self._socket = bind(host, port)
        self.host, self.port = self._socket.getsockname()[:2]
        options: ServerOptions = app.state.localspec.options
        config = server_config(app, options, log_level="warning")
        self._server = GracefulServer(config, drain_hook(app))
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            name="localspec-uvicorn",
            daemon=True,
        )

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the background server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = START_TIMEOUT_SECONDS) -> None:
        """Shut down as `localspec serve` does on SIGTERM, and wait up to ``timeout`` s."""
        self._server.begin_exit()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._socket.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
