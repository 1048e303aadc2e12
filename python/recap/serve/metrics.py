"""What `GET /metrics` answers, in Prometheus' text format (`prometheus_client`): requests by
outcome, tokens in and out, the queue and the running rows, and RECAP's figures per request
(tau, the time of one decoding step), latency and time to the first token. Each server holds
its own registry, so two servers in one process (the tests run several) never share counts."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE  # noqa: F401 - re-exported for the app
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("recap_requests", "Requests answered, by outcome", ["outcome"], registry=r)
        self.rejected = Counter("recap_rejected", "Requests refused because the queue was full", registry=r)
        self.prompt_tokens = Counter("recap_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.completion_tokens = Counter("recap_completion_tokens", "Tokens generated", registry=r)
        self.queue = Gauge("recap_queue_length", "Requests admitted and waiting for a row", registry=r)
        self.running = Gauge("recap_running_rows", "Requests decoding now", registry=r)
        self.tau = Histogram("recap_tau", "Tokens committed per verification step, per request",
                             buckets=(1, 1.25, 1.5, 1.75, 2, 2.5, 3, 4, 6, 8), registry=r)
        self.step = Histogram("recap_step_seconds", "Mean verification step time, per request",
                              buckets=(0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1), registry=r)
        self.latency = Histogram("recap_request_seconds", "Time from admission to the last token",
                                 buckets=_SECONDS, registry=r)
        self.ttft = Histogram("recap_time_to_first_token_seconds", "Time from admission to the first token",
                              buckets=_SECONDS, registry=r)

    def finished(self, prompt_tokens: int, completion_tokens: int, figures: dict, latency_s: float,
                 ttft_s: float | None, outcome: str) -> None:
        self.requests.labels(outcome=outcome).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(completion_tokens)
        if figures.get("steps"):
            self.tau.observe(figures["tau"])
            self.step.observe(figures["ms_per_step"] / 1e3)
        self.latency.observe(latency_s)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)

    def failed(self, outcome: str) -> None:
        self.requests.labels(outcome=outcome).inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)
