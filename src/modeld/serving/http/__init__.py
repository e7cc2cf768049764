"""The HTTP server (FastAPI + uvicorn): OpenAI-compatible routes, the native session API,
/metrics and /healthz. Import `modeld.serving.http.app` (it pulls in FastAPI); this package
itself stays light."""
