"""What recap keeps with a user's model, in one holder: the decoder `recap.generate` uses,
the visual-token router `recap.catchup` attached, and the lock that makes a prefill and the
per-request state the model keeps on itself (M-RoPE offsets) one step for concurrent
requests. Copies of the model (deepcopy, pickle) start with an empty holder."""

from __future__ import annotations

import threading
from typing import Any

import torch

_ATTR = "_recap_state"
_CREATE = threading.Lock()


class ModelState:
    def __init__(self) -> None:
        self.decoder: Any = None
        self.router: Any = None
        self.prefill_lock = threading.Lock()

    def __deepcopy__(self, memo) -> ModelState:
        return ModelState()

    def __reduce__(self):
        return (ModelState, ())


def state_of(model: torch.nn.Module) -> ModelState:
    """The model's holder, created on first use."""
    state = model.__dict__.get(_ATTR)
    if state is None:
        with _CREATE:
            state = model.__dict__.setdefault(_ATTR, ModelState())
    return state


def peek(model: torch.nn.Module) -> ModelState | None:
    """The model's holder if recap has used the model, else None (nothing is created)."""
    return model.__dict__.get(_ATTR)
