"""The engine behind `recap serve`: admission, a bounded queue, and continuous batching of
the running requests on a `recap.ContinuousBatch`.

request -> admit (queue bound, else 429; draining, else 503) -> between two steps the
scheduler joins it to the running batch (its prompt prefilled alone into a free row) ->
every step verifies every running row's tree in one pass -> every committed token reaches
the request's event stream -> done (usage, RECAP's figures) and its row leaves.

At most `max_running` rows decode together; a request that arrives while they run waits in
the queue only until a row ends, not until the batch does. A row leaves when it ends: at
EOS, ``max_tokens``, a stop string, or when it is cancelled (the client went away, or the
server is stopping), which the batch sees at its next step through a stopping criterion.
Each row has its own session, sampling settings, seed, stop rules and memory scope, and its
output is its own batch-1 `generate` output whoever shares its steps. One thread, the
scheduler, runs every pass.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from recap.decoding.continuous import ContinuousBatch, Row
from recap.serve.metrics import Metrics
from recap.serve.protocol import ApiError, Completion


@dataclass(eq=False)  # compared (and hashed) by identity: the engine keeps a set of running jobs
class Job:
    """One admitted request and the channel its events go back on."""

    request: Completion
    prompt_ids: list[int]
    scope: str | None
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    cancel: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None
    stream: Any = None  # its `_TextStream`, once it runs

    def send(self, *event: Any) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class _Cancelled:
    """A stopping criterion: the row ends at the decoder's next check once `cancel` is set."""

    def __init__(self, cancel: threading.Event) -> None:
        self.cancel = cancel

    def __call__(self, input_ids: torch.Tensor, scores: Any, **_kw: Any) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.cancel.is_set(), dtype=torch.bool)


class _TextStream:
    """The decoder's streamer for one row: turns committed tokens into text deltas, holds back
    what could still become a stop string (or an unfinished character), and ends the row at
    a stop string."""

    def __init__(self, job: Job, tokenizer: Any, stops: list[str]) -> None:
        self.job, self.tok, self.stops = job, tokenizer, stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0  # characters of the text already sent
        self.stopped = False
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # the decoder hands over the prompt first
            self.prompt_seen = True
            return
        if self.stopped:
            return
        if self.job.first_token_s is None:
            self.job.first_token_s = time.perf_counter() - self.job.submitted
        self.ids.extend(int(t) for t in value.reshape(-1).tolist())
        text = self.text()
        for s in self.stops:
            at = text.find(s)
            if at >= 0:
                self.stopped = True
                self.job.cancel.set()  # the row leaves at the next step
                self._send(text[:at])
                return
        if text.endswith("\ufffd"):  # a character split across tokens: wait for its end
            return
        self._send(text[: max(self.sent, len(text) - self.hold)])

    def end(self) -> None:
        if not self.stopped:
            self._send(self.text())

    def text(self) -> str:
        return self.tok.decode(self.ids, skip_special_tokens=True)

    def final_text(self) -> str:
        text = self.text()
        for s in self.stops:
            at = text.find(s)
            if at >= 0:
                text = text[:at]
        return text

    def _send(self, upto: str) -> None:
        if len(upto) > self.sent:
            self.job.send("delta", upto[self.sent:])
            self.sent = len(upto)


def _figures(stats: dict) -> dict:
    """RECAP's figures of one request, as the response's `recap` field shows them."""
    steps = int(stats.get("steps") or 0)
    drafted = round(float(stats.get("mean_tree_size") or 0.0) * steps) - steps  # tree nodes less roots
    decode_s = float(stats.get("total_s") or 0.0) - float(stats.get("prefill_s") or 0.0)
    return {"tau": float(stats.get("tau") or 1.0), "steps": steps, "drafted_tokens": max(drafted, 0),
            "accepted_tokens": int(stats.get("observed_accepted") or 0),
            "undrafted_steps": int(stats.get("undrafted_steps") or 0),
            "ms_per_step": decode_s / steps * 1e3 if steps else 0.0,
            "prefill_ms": float(stats.get("prefill_s") or 0.0) * 1e3}


class Engine:
    """Runs admitted requests as the rows of one continuous batch, at most `max_running` at a time."""

    def __init__(self, decoder: Any, tokenizer: Any, *, max_running: int = 4, max_queue: int = 64,
                 context_window: int | None = None, metrics: Metrics | None = None,
                 chat_template: Callable[[list[dict]], list[int]] | None = None) -> None:
        if max_running < 1 or max_queue < 0:
            raise ValueError(f"max_running >= 1 and max_queue >= 0 expected, got {max_running}, {max_queue}")
        self.decoder, self.tok = decoder, tokenizer
        self.max_running, self.max_queue = max_running, max_queue
        self.context_window = context_window
        self.metrics = metrics or Metrics()
        self._chat = chat_template
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._waiting = 0
        self._running = 0
        self._lock = threading.Lock()
        self._draining = False
        self._running_jobs: set[Job] = set()
        self._scheduler = threading.Thread(target=self._schedule, name="recap-scheduler", daemon=True)
        self._scheduler.start()

    # ---- admission --------------------------------------------------------------------------
    def prompt_ids(self, req: Completion) -> list[int]:
        if req.kind == "chat":
            assert req.messages is not None
            made: Any = self._chat(req.messages) if self._chat else self.tok.apply_chat_template(
                req.messages, add_generation_prompt=True, tokenize=True)
            if hasattr(made, "keys"):  # newer tokenizers return a BatchEncoding
                made = made["input_ids"]
            ids = list(made)
        elif isinstance(req.prompt, str):
            ids = list(self.tok(req.prompt, add_special_tokens=False)["input_ids"])
        else:
            ids = list(req.prompt or [])
            vocab = self.decoder.adapter.vocab_size
            bad = [t for t in ids if t >= vocab]
            if bad:
                raise ApiError(400, f"prompt: token ids below {vocab} expected, got {bad[0]}", param="prompt",
                               code="invalid_value")
        if not ids:
            raise ApiError(400, "prompt: the prompt has no tokens", param="prompt")
        if self.context_window is not None and len(ids) + req.sampling.max_tokens > self.context_window:
            raise ApiError(400, f"max_tokens: the prompt's {len(ids)} tokens plus max_tokens "
                                f"{req.sampling.max_tokens} exceed the context window of {self.context_window}",
                           param="max_tokens", code="context_length_exceeded")
        return ids

    def submit(self, req: Completion, scope: str | None, loop: asyncio.AbstractEventLoop) -> Job:
        """Admits a request, or raises ApiError: 503 while stopping, 429 when the queue is full."""
        ids = self.prompt_ids(req)
        job = Job(req, ids, scope, loop, asyncio.Queue())
        with self._lock:
            if self._draining:
                raise ApiError(503, "the server is shutting down", kind="server_error", code="shutting_down")
            if self._waiting + self._running >= self.max_queue + self.max_running:
                self.metrics.rejected.inc()
                raise ApiError(429, f"the queue is full ({self.max_queue} waiting); retry later",
                               kind="rate_limit_error", code="queue_full", headers={"Retry-After": "1"})
            self._waiting += 1
            self.metrics.queue.set(self._waiting)
        self._queue.put(job)
        return job

    # ---- the rows ---------------------------------------------------------------------------
    def _schedule(self) -> None:
        """Between steps: join waiting requests to free rows; then one step for every row."""
        batch = ContinuousBatch(self.decoder)
        jobs: dict[int, Job] = {}  # id(row) -> its request
        stopping = False  # `close` has cancelled the rows: they end at the next step
        while not (stopping and not batch.rows):
            while not stopping and len(batch.rows) < self.max_running:
                try:
                    job = self._queue.get(block=not batch.rows)
                except queue.Empty:
                    break
                if job is None:
                    stopping = True
                    break
                self._start(job)
                self._join(batch, job, jobs)
            if not batch.rows:
                continue
            try:
                ended = batch.step()
            except Exception as e:  # noqa: BLE001 - the shared pass failed: its rows fail, the server goes on
                error = ApiError(500, f"the request failed: {type(e).__name__}: {e}", kind="server_error",
                                 code="internal_error")
                rows, batch.rows = batch.rows, []
                batch.close()
                for row in rows:
                    self._fail(jobs.pop(id(row)), error)
                continue
            for row in ended:
                self._done(jobs.pop(id(row)), row)

    def _start(self, job: Job) -> None:
        with self._lock:
            self._waiting -= 1
            self._running += 1
            self._running_jobs.add(job)
            self.metrics.queue.set(self._waiting)
            self.metrics.running.set(self._running)

    def _join(self, batch: ContinuousBatch, job: Job, jobs: dict[int, Job]) -> None:
        if job.cancel.is_set():
            self.metrics.failed("cancelled")
            job.send("done", "cancelled", 0, {}, "")
            self._leave(job)
            return
        try:
            row = batch.join(self.decoder.request(torch.tensor([job.prompt_ids], dtype=torch.long),
                                                  **self._generation_kwargs(job)), memory_scope=job.scope)
        except ApiError as e:
            self._fail(job, e)
            return
        except Exception as e:  # noqa: BLE001 - one request fails, the server keeps serving
            self._fail(job, ApiError(500, f"the request failed: {type(e).__name__}: {e}", kind="server_error",
                                     code="internal_error"))
            return
        if row.ended:
            self._done(job, row)
        else:
            jobs[id(row)] = job

    def _generation_kwargs(self, job: Job) -> dict[str, Any]:
        """What the row decodes with: its length, stream, cancellation, sampling and seed."""
        s = job.request.sampling
        job.stream = _TextStream(job, self.tok, s.stop)
        kw: dict[str, Any] = dict(max_new_tokens=s.max_tokens, streamer=job.stream,
                                  stopping_criteria=[_Cancelled(job.cancel)])
        if not s.greedy:
            seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(7), "little")
            kw.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=0, seed=seed)
        return kw

    def _done(self, job: Job, row: Row) -> None:
        if row.error is not None:
            self._fail(job, ApiError(500, f"the request failed: {type(row.error).__name__}: {row.error}",
                                     kind="server_error", code="internal_error"))
            return
        new, stream = row.out, job.stream
        assert stream is not None
        if stream.stopped:
            reason = "stop"
        elif job.cancel.is_set():
            reason = "cancelled"
        elif new and new[-1] in row.req.eos:
            reason = "stop"
        else:
            reason = "length"
        figures = _figures(row.stats.as_dict() if row.stats is not None else {})
        self.metrics.finished(len(job.prompt_ids), len(new), figures, time.perf_counter() - job.submitted,
                              job.first_token_s, reason)
        job.send("done", reason, len(new), figures, stream.final_text())
        self._leave(job)

    def _fail(self, job: Job, error: ApiError) -> None:
        self.metrics.failed("error")
        job.send("error", error)
        self._leave(job)

    def _leave(self, job: Job) -> None:
        with self._lock:
            self._running -= 1
            self._running_jobs.discard(job)
            self.metrics.running.set(self._running)

    # ---- stopping ---------------------------------------------------------------------------
    def stop_admitting(self) -> None:
        """From now on a new request gets 503; admitted ones go on."""
        with self._lock:
            self._draining = True

    def close(self, grace_s: float = 10.0) -> None:
        """Stops admitting, lets running and queued rows finish for `grace_s`, cancels the
        rest (they end at the next step), and stops the scheduler."""
        self.stop_admitting()
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._running == 0 and self._waiting == 0:
                    break
            time.sleep(0.05)
        with self._lock:
            for job in self._running_jobs:
                job.cancel.set()
        # Queued jobs not yet joined end as cancelled here.
        while True:
            try:
                left = self._queue.get_nowait()
            except queue.Empty:
                break
            if left is not None:
                left.send("done", "cancelled", 0, {}, "")
                with self._lock:
                    self._waiting -= 1
        self._queue.put(None)
        self._scheduler.join(timeout=max(5.0, grace_s))

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def load(self) -> tuple[int, int]:
        """(running rows, queued requests)."""
        with self._lock:
            return self._running, self._waiting
