"""T2 serving: the session contract, sessions, the runtime and the HTTP server.

Light to import: FastAPI/pydantic load only with `modeld.serving.http.app`.
"""
