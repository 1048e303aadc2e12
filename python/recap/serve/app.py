"""The HTTP side of `recap serve` (a Starlette app): the OpenAI API's routes over an `Engine`.

POST /v1/chat/completions and /v1/completions (streamed as server-sent events when
``stream`` is true, as the OpenAI API sends them: ``data: {chunk}`` lines, then
``data: [DONE]``); GET /v1/models, /health, /metrics. Every error is OpenAI's body with a
4xx or 5xx status. With API keys, a request names its tenant by ``Authorization: Bearer
KEY`` and drafts from that tenant's memory scope only.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from recap.serve.engine import Engine, Job
from recap.serve.metrics import CONTENT_TYPE
from recap.serve.protocol import ApiError, Completion, parse

MAX_BODY_BYTES = 4 << 20
# How often a non-streamed request checks that its client is still there.
_POLL_S = 0.25


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def create_app(engine: Engine, model_name: str, *, keys: dict[str, str] | None = None,
               max_tokens_limit: int = 2048) -> Starlette:
    """`keys`: API key -> memory scope (None: no key asked for, every request drafts from the
    decoder's own memory)."""

    def tenant(request: Request) -> str | None:
        if not keys:
            return None
        auth = request.headers.get("authorization", "")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if key not in keys:
            raise ApiError(401, "an API key is required: Authorization: Bearer KEY, with a key this server knows",
                           kind="authentication_error", code="invalid_api_key")
        return keys[key]

    async def read(request: Request, kind: str) -> Completion:
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            raise ApiError(413, f"the request body: at most {MAX_BODY_BYTES} bytes, got {len(raw)}")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body: expected JSON, got a parse error ({e})", code="invalid_json") from e
        req = parse(kind, body, max_tokens_limit=max_tokens_limit)
        if req.model != model_name:
            raise ApiError(404, f"model: this server serves {model_name!r}, got {req.model!r}", param="model",
                           code="model_not_found")
        return req

    async def completions(request: Request, kind: str) -> Response:
        try:
            scope = tenant(request)
            req = await read(request, kind)
            job = engine.submit(req, scope, asyncio.get_running_loop())
        except ApiError as e:
            return _error(e)
        reply = _Reply(kind, model_name, req, job)
        if req.stream:
            return StreamingResponse(reply.stream(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await reply.whole(request)

    async def chat(request: Request) -> Response:
        return await completions(request, "chat")

    async def text(request: Request) -> Response:
        return await completions(request, "text")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": started, "owned_by": "recap-rs"}]})

    async def health(request: Request) -> Response:
        running, queued = engine.load
        status = "draining" if engine.draining else "ok"
        return JSONResponse({"status": status, "running": running, "queued": queued},
                            status_code=503 if engine.draining else 200)

    async def metrics(request: Request) -> Response:
        return Response(engine.metrics.text(), media_type=CONTENT_TYPE)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        what = {404: "no such route", 405: "method not allowed on this route"}.get(exc.status_code, exc.detail)
        return _error(ApiError(exc.status_code, f"{request.method} {request.url.path}: {what}",
                               code="not_found" if exc.status_code == 404 else None))

    started = int(time.time())
    routes = [Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/v1/completions", text, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/health", health, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})


class _Reply:
    """One request's answer, whole or as a stream of chunks, in the endpoint's shape."""

    def __init__(self, kind: str, model: str, req: Completion, job: Job) -> None:
        self.kind, self.model, self.req, self.job = kind, model, req, job
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.object = "chat.completion" if kind == "chat" else "text_completion"

    def _usage(self, completion_tokens: int) -> dict:
        prompt = len(self.job.prompt_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                "total_tokens": prompt + completion_tokens}

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    async def whole(self, request: Request) -> Response:
        """Waits for the end (cancelling the row if the client goes away meanwhile)."""
        while True:
            try:
                event = await asyncio.wait_for(self.job.events.get(), _POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    self.job.cancel.set()
                    return Response(status_code=499)
                continue
            if event[0] == "error":
                return _error(event[1])
            if event[0] == "done":
                _, reason, n, figures, final = event
                choice: dict = {"index": 0, "finish_reason": reason, "logprobs": None}
                if self.kind == "chat":
                    choice["message"] = {"role": "assistant", "content": final}
                else:
                    choice["text"] = final
                return JSONResponse(self._head(self.object) | {"choices": [choice], "usage": self._usage(n),
                                                               "recap": figures})

    def _chunk(self, text: str | None, reason: str | None, first: bool = False) -> dict:
        if self.kind == "chat":
            delta: dict = {"role": "assistant", "content": ""} if first else ({} if text is None else
                                                                             {"content": text})
            choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
            return self._head("chat.completion.chunk") | {"choices": [choice]}
        choice = {"index": 0, "text": text or "", "finish_reason": reason, "logprobs": None}
        return self._head("text_completion") | {"choices": [choice]}

    async def stream(self) -> AsyncIterator[str]:
        """Server-sent events; a client that goes away cancels the row (Starlette cancels
        this generator, and the row leaves at its next step)."""
        def sse(obj: dict) -> str:
            return f"data: {json.dumps(obj)}\n\n"

        try:
            if self.kind == "chat":
                yield sse(self._chunk(None, None, first=True))
            while True:
                event = await self.job.events.get()
                if event[0] == "delta":
                    yield sse(self._chunk(event[1], None))
                elif event[0] == "error":
                    yield sse(event[1].body())
                    break
                else:
                    _, reason, n, figures, _final = event
                    yield sse(self._chunk(None, reason) | {"recap": figures})
                    if self.req.include_usage:
                        yield sse(self._head(self._chunk(None, None)["object"]) | {"choices": [],
                                                                                    "usage": self._usage(n)})
                    break
            yield "data: [DONE]\n\n"
        finally:
            self.job.cancel.set()  # a no-op for a row that ended; frees one whose client left
