"""`recap serve`: an OpenAI-compatible HTTP server over `recap.Decoder` (the `serve` extra:
``pip install "recap-rs[serve]"``). See docs/serve.md."""

from recap.serve.app import create_app
from recap.serve.engine import Engine
from recap.serve.server import build, read_keys, run

__all__ = ["Engine", "build", "create_app", "read_keys", "run"]
