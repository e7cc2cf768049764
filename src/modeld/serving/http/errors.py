"""Every failure becomes an OpenAI-style body: {"error": {"message", "type", "param", "code"}}.

`code` is the error's class name (e.g. "ContextOverflow"), `param` the request field at fault.
FastAPI's default 422 handler is replaced so that validation failures have the same shape, and a
catch-all turns unexpected exceptions into a named 500 without killing the server.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from modeld.errors import ModeldError

log = logging.getLogger("modeld.http")

_MODEL_ERRORS = {"ModelNotFound", "ArtifactMissing", "NoCellCanServe", "InvalidIdentity"}


def error_payload(exc: BaseException) -> tuple[int, dict]:
    """(status, body) for any exception; pure."""
    if isinstance(exc, ModeldError):
        name = type(exc).__name__
        param = getattr(exc, "param", None)
        if param is None and name in _MODEL_ERRORS:
            param = "model"
        status = int(getattr(exc, "http_status", 400))
        etype = getattr(exc, "error_type", "invalid_request_error" if status < 500 else "server_error")
        message = " ".join(str(exc).split()) or name
    else:
        name, param, status, etype = "InternalError", None, 500, "server_error"
        message = f"{type(exc).__name__}: {exc}"
    return status, {"error": {"message": message, "type": etype, "param": param, "code": name}}


def error_response(exc: BaseException, metrics=None) -> JSONResponse:
    status, body = error_payload(exc)
    if metrics is not None:
        metrics.errors.labels(body["error"]["code"]).inc()
    return JSONResponse(body, status_code=status)


def validation_body(errors: list[dict]) -> dict:
    """Turn pydantic/FastAPI validation errors into one message naming the first bad field."""
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
    param = ".".join(loc) or None
    message = first.get("msg", "invalid request")
    if first.get("type") == "json_invalid":
        param, message = None, "request body is not valid JSON"
    return {"error": {"message": f"{param}: {message}" if param else message,
                      "type": "invalid_request_error", "param": param, "code": "InvalidRequest"}}


def install_error_handlers(app: FastAPI, metrics) -> None:
    @app.exception_handler(ModeldError)
    async def _modeld(request: Request, exc: ModeldError):
        return error_response(exc, metrics)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        metrics.errors.labels("InvalidRequest").inc()
        return JSONResponse(validation_body(list(exc.errors())), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        code = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
        metrics.errors.labels(code).inc()
        body = {"error": {"message": str(exc.detail), "type": "invalid_request_error",
                          "param": None, "code": code}}
        return JSONResponse(body, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("internal error on %s", request.url.path)
        return error_response(exc, metrics)
