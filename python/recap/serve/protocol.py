"""The OpenAI API's request bodies, validated: what `recap serve` accepts, and the error it
answers with when a field is wrong (OpenAI's shape: {"error": {"message", "type", "param",
"code"}}, with a 4xx status).

Only the fields the API defines are accepted; a field the API defines but this server does
not implement (``logprobs``, ``tools``, ``n`` > 1, ...) is refused by name rather than
silently ignored, as is any field the API does not define.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


class ApiError(Exception):
    """An error answered to the client: `status`, and OpenAI's error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad(param: str, expected: str, got: Any) -> ApiError:
    return ApiError(400, f"{param}: expected {expected}, got {_show(got)}", param=param, code="invalid_value")


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass
class Sampling:
    """What decides the tokens: greedy when temperature is 0 (or absent), else sampled."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Completion:
    """One validated request: the prompt (text, chat messages or token ids), how to sample,
    whether to stream."""

    kind: str  # "chat" or "text"
    model: str
    sampling: Sampling
    stream: bool
    messages: list[dict] | None = None
    prompt: str | list[int] | None = None
    include_usage: bool = False


# Fields the API defines, by endpoint; those in UNSUPPORTED are refused by name.
_COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "stream_options",
           "frequency_penalty", "presence_penalty", "logit_bias", "logprobs", "user"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "response_format", "tools",
                         "tool_choice", "parallel_tool_calls", "metadata", "store", "modalities", "audio",
                         "prediction", "reasoning_effort", "service_tier", "functions", "function_call"}
TEXT_FIELDS = _COMMON | {"prompt", "echo", "best_of", "suffix"}
# Defined by the API, accepted only at their neutral value.
_NEUTRAL: dict[str, Any] = {"n": 1, "frequency_penalty": 0, "presence_penalty": 0, "logit_bias": None,
                            "logprobs": None, "top_logprobs": None, "echo": False, "best_of": 1, "suffix": None,
                            "tools": None, "tool_choice": None, "functions": None, "function_call": None,
                            "response_format": None, "parallel_tool_calls": None, "audio": None,
                            "prediction": None, "modalities": None, "reasoning_effort": None,
                            "service_tier": None, "store": None, "metadata": None}
MAX_STOP = 4


def parse(kind: str, body: Any, *, max_tokens_limit: int) -> Completion:
    """Validates a /v1/chat/completions ("chat") or /v1/completions ("text") body."""
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body: expected a JSON object, got {type(body).__name__}")
    allowed = CHAT_FIELDS if kind == "chat" else TEXT_FIELDS
    for name in body:
        if name not in allowed:
            raise ApiError(400, f"{name}: not a field of this endpoint's request", param=name,
                           code="unknown_field")
    for name, neutral in _NEUTRAL.items():
        value = body.get(name)
        if value is not None and value != neutral and not (name == "logprobs" and value is False):
            raise ApiError(400, f"{name}: not supported by this server (expected {neutral!r} or absent), "
                                f"got {_show(body[name])}", param=name, code="unsupported_value")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "a model name (string)", model)
    limit_name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = body.get(limit_name, 16 if kind == "text" else None)
    if max_tokens is None:
        max_tokens = max_tokens_limit
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad(limit_name, "an integer >= 1", max_tokens)
    if max_tokens > max_tokens_limit:
        raise ApiError(400, f"{limit_name}: at most {max_tokens_limit} on this server, got {max_tokens}",
                       param=limit_name, code="too_large")
    sampling = Sampling(max_tokens=max_tokens, temperature=_number(body, "temperature", 0.0, 0.0, 2.0),
                        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, open_low=True), seed=_seed(body),
                        stop=_stop(body))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", "true or false", stream)
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise bad("stream_options", 'an object {"include_usage": bool}', options)
        include_usage = bool(options.get("include_usage", False))
    if kind == "chat":
        return Completion("chat", model, sampling, stream, messages=_messages(body.get("messages")),
                          include_usage=include_usage)
    return Completion("text", model, sampling, stream, prompt=_prompt(body.get("prompt")),
                      include_usage=include_usage)


def _number(body: dict, name: str, default: float, low: float, high: float, open_low: bool = False) -> float:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad(name, f"a number in {'(' if open_low else '['}{low}, {high}]", v)
    if v > high or v < low or (open_low and v == low):
        raise bad(name, f"a number in {'(' if open_low else '['}{low}, {high}]", v)
    return float(v)


def _seed(body: dict) -> int | None:
    v = body.get("seed")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not (-(2**63) <= v < 2**63):
        raise bad("seed", "a 64-bit integer", v)
    return v


def _stop(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    stops = [v] if isinstance(v, str) else v
    if (not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops)
            or len(stops) > MAX_STOP):
        raise bad("stop", f"a non-empty string or a list of at most {MAX_STOP}", v)
    return list(stops)


def _messages(v: Any) -> list[dict]:
    if not isinstance(v, list) or not v:
        raise bad("messages", "a non-empty list of {role, content} objects", v)
    out = []
    for i, m in enumerate(v):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(where, "an object with role and content", m)
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "developer", "user", "assistant"):
            raise bad(f"{where}.role", "one of system, developer, user, assistant", role)
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise bad(f"{where}.content", 'a string or a list of {"type": "text", "text": ...} parts', content)
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad(f"{where}.content", "a string", content)
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def _prompt(v: Any) -> str | list[int]:
    if isinstance(v, str) and v:
        return v
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str) and v[0]:
        return v[0]
    if (isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v)):
        return list(v)
    raise bad("prompt", "a non-empty string or a non-empty list of token ids (one prompt)", v)
