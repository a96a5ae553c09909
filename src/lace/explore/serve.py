"""Serving the explorer from a background thread (tests, screenshots, notebooks) on a free port."""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI

START_TIMEOUT_SECONDS = 30.0


class BackgroundServer:
    """`with BackgroundServer(app) as url:` serves `app` on 127.0.0.1 at a free port until the block ends."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0):
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.host = host

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the explorer's server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://{self.host}:{port}/"

    def __exit__(self, *_) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
