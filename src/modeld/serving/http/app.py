"""The FastAPI application and the uvicorn entry point."""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.responses import Response

from modeld import __version__
from modeld.serving.http import openai_routes, session_routes
from modeld.serving.http.errors import install_error_handlers
from modeld.serving.http.state import ServerConfig, ServerState
from modeld.serving.runtime import Runtime


def create_app(runtime: Runtime, config: ServerConfig = ServerConfig()) -> FastAPI:
    """An app serving `runtime`. Mutates nothing until requests arrive (models load lazily)."""
    app = FastAPI(title="modeld", version=__version__)
    state = ServerState(runtime, config)
    app.state.modeld = state
    install_error_handlers(app, state.metrics)

    @app.middleware("http")
    async def count_requests(request: Request, call_next):
        response = await call_next(request)
        route = request.scope.get("route")
        state.metrics.requests.labels(getattr(route, "path", "unmatched"), str(response.status_code)).inc()
        return response

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok", "version": __version__, "uptime_s": round(time.time() - state.started, 3),
                "loaded": [{"model": lc.name, "cell": lc.spec.cell_id} for lc in runtime.loaded()],
                "in_flight": state.admission.count}

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    app.include_router(openai_routes.router)
    app.include_router(session_routes.router)
    return app


def serve(runtime: Runtime, host: str = "127.0.0.1", port: int = 8000,
          config: ServerConfig = ServerConfig(), log_level: str = "warning") -> None:
    """Run uvicorn until interrupted (blocks)."""
    import uvicorn

    uvicorn.run(create_app(runtime, config), host=host, port=port, log_level=log_level)
