"""Servers for the serving tests: uvicorn on a free loopback port, in a thread of the test
process (so a test can look at the engine). A module of its own name: `conftest` is a name
every test folder has, so importing from it picks whichever was imported first."""

from __future__ import annotations

import socket
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """uvicorn in a thread of the test process (so the test can look at the engine)."""

    def __init__(self, app, port: int) -> None:
        import uvicorn

        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                    timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def start_server(model_dir: str, **app_kwargs):
    """(server, async_engine) on a free port; the caller stops the server."""
    from toolkit import LLM
    from toolkit.entrypoints.async_engine import AsyncEngine
    from toolkit.serving.app import build_app

    engine = AsyncEngine(LLM(model_dir, num_blocks=256, block_size=8, max_num_seqs=32))
    app = build_app(engine, model_name="tiny", **app_kwargs)
    return Server(app, free_port()), engine


