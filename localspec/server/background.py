"""Run an app with uvicorn on a background thread (notebooks, tests, embedding).

    with BackgroundServer(create_app(engine)) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")

The socket is bound before the thread starts (port 0 picks a free port without a race).
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType

import uvicorn
from starlette.types import ASGIApp

START_TIMEOUT_SECONDS = 10.0


class BackgroundServer:
    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = self._socket.getsockname()[:2]
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            name="localspec-uvicorn",
            daemon=True,
        )

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the background server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(START_TIMEOUT_SECONDS)
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
