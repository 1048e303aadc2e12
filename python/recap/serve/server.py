"""`recap serve`: load a model, warm its decoder, and serve the app with uvicorn until SIGTERM.

SIGTERM (or Ctrl-C) stops admitting at once (a new request gets 503), lets what runs finish
for `grace_s`, cancels what is left, and returns; the command then exits 0.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from recap.serve.app import create_app
from recap.serve.engine import Engine
from recap.serve.metrics import Metrics


def read_keys(api_key: str | None, keys_file: str | None) -> dict[str, str] | None:
    """API key -> memory scope. `--api-key KEY` is the scope "default"; a keys file holds one
    ``KEY [SCOPE]`` per line (the scope defaults to the key's line number: "tenant-N"), with
    # comments and blank lines skipped."""
    keys: dict[str, str] = {}
    if api_key:
        keys[api_key] = "default"
    if keys_file:
        for i, line in enumerate(Path(keys_file).read_text().splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) > 2:
                raise ValueError(f"{keys_file}:{i}: expected 'KEY [SCOPE]', got {line.strip()!r}")
            keys[words[0]] = words[1] if len(words) == 2 else f"tenant-{i}"
    return keys or None


def context_window(model: Any) -> int | None:
    n = getattr(model.config, "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def build(model: Any, tokenizer: Any, *, drafter: str = "recap", keys: dict[str, str] | None = None,
          max_running: int = 4, max_queue: int = 64, memory_bytes: int = 256 << 20, warm: bool = True):
    """(decoder, engine): a `recap.Decoder` with budget="auto" (and, with keys, a memory pool
    whose scopes are the tenants) and the engine over it. `warm`: run the decoder's first use
    (conformance probe, cost curve) now, not in the first request."""
    import torch

    import recap

    pool = recap.MemoryPool(memory_bytes) if keys and recap.decoding.drafters.spec(drafter).uses_memory else None
    decoder = recap.Decoder(model, recap.RecapConfig(budget="auto"), pool, drafter=drafter)
    if warm:
        decoder.generate(torch.tensor([[1, 2, 3, 1, 2, 3]]), max_new_tokens=4)
    engine = Engine(decoder, tokenizer, max_running=max_running, max_queue=max_queue,
                    context_window=context_window(model), metrics=Metrics())
    return decoder, engine


def _serve_then_exit_cleanly(server: Any) -> None:
    """Runs uvicorn. After a graceful shutdown uvicorn raises the signal again under the handler
    that was there before it; ours takes it, since the drain it asks for is done: exit 0."""
    if threading.current_thread() is not threading.main_thread():
        server.run()
        return
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(model: Any, tokenizer: Any, model_name: str, *, host: str = "127.0.0.1", port: int = 8000,
        drafter: str = "recap", keys: dict[str, str] | None = None, max_running: int = 4, max_queue: int = 64,
        max_tokens: int = 2048, grace_s: float = 30.0, log_level: str = "warning",
        started: float | None = None) -> int:
    import uvicorn

    _, engine = build(model, tokenizer, drafter=drafter, keys=keys, max_running=max_running, max_queue=max_queue)
    app = create_app(engine, model_name, keys=keys, max_tokens_limit=max_tokens)

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            engine.stop_admitting()  # new requests get 503 while the running ones finish
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=int(grace_s),
                            lifespan="off")
    server = _Server(config)
    took = f" in {time.perf_counter() - started:.1f} s" if started is not None else ""
    print(f"recap serve: {model_name} on http://{host}:{port}/v1 (drafter {drafter}, {max_running} rows, "
          f"queue {max_queue}{', API keys' if keys else ''}), ready{took}", flush=True)
    _serve_then_exit_cleanly(server)
    engine.close(grace_s=min(grace_s, 5.0))
    print("recap serve: stopped", file=sys.stderr, flush=True)
    return 0
