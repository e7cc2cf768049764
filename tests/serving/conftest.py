"""Serving fixtures: one Runtime (its own MODELD_HOME with the null test cell installed) and
the REAL server on loopback (uvicorn in a background thread), shared by the whole session."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from serving_null_cell import NULL_FACTORIES, install_null_cell


@pytest.fixture(scope="session")
def serving_home(tmp_path_factory, smollm2_gguf):
    home = tmp_path_factory.mktemp("serving-home")
    install_null_cell(home)
    return home


@pytest.fixture(scope="session")
def runtime(serving_home):
    from modeld.serving.runtime import Runtime
    from modeld.serving.selection import CellOptions

    rt = Runtime(home=serving_home, options=CellOptions(n_ctx=2048), extra_factories=NULL_FACTORIES,
                 extra_backends=frozenset({"null"}))
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def smol(runtime):
    """The loaded SmolLM2 llama.cpp cell."""
    return runtime.load("smollm2")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server(runtime, smol):
    import uvicorn

    from modeld.serving.http.app import create_app
    from modeld.serving.http.state import ServerConfig

    app = create_app(runtime, ServerConfig(max_queue=3, request_timeout_s=60))
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not srv.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)
    app.state.modeld.close()


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server, timeout=60) as c:
        yield c
