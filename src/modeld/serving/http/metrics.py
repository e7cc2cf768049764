"""Prometheus metrics of one server instance (its own registry: several apps can coexist)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("modeld_requests_total", "HTTP requests by route and status",
                                ["route", "status"], registry=self.registry)
        self.tokens = Counter("modeld_tokens_total", "Tokens by kind (prompt, completion, reused, prefilled)",
                              ["kind"], registry=self.registry)
        self.ttft = Histogram("modeld_ttft_seconds", "Time to first token",
                              buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                              registry=self.registry)
        self.errors = Counter("modeld_errors_total", "Errors by name", ["name"], registry=self.registry)
        self.in_flight = Gauge("modeld_requests_in_flight", "Admitted engine requests (running + queued)",
                               registry=self.registry)
        self.cancelled = Counter("modeld_cancelled_total", "Generations aborted by client disconnect",
                                 registry=self.registry)

    def observe_trace(self, trace) -> None:
        self.tokens.labels("prompt").inc(trace.prompt_tokens)
        self.tokens.labels("completion").inc(trace.completion_tokens)
        self.tokens.labels("reused").inc(trace.reused_tokens)
        self.tokens.labels("prefilled").inc(trace.prefilled_tokens)
        if trace.completion_tokens:
            self.ttft.observe(trace.ttft_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
