"""What recap keeps with a user's model, in one holder (held by the model, so it goes when
the model goes): the decoders `recap.generate` uses, the visual-token router `recap.catchup`
attached, the linear layout and its timing decisions, the measured cost curves, the
conformance probe's verdict, its requests' count, and the lock that makes a prefill and the
per-request state the model keeps on itself (M-RoPE offsets) one step for concurrent
requests. Copies of the model (deepcopy, pickle) start with an empty holder: nothing
measured on one model is trusted for another."""

from __future__ import annotations

import copy
import threading
from typing import Any

import torch

# The holder imports nothing of recap, not even for annotations (the modules that fill it all
# import it): its fields are typed `Any`, and the comment beside each names what it holds.

_ATTR = "_recap_state"
_CREATE = threading.Lock()


class ModelState:
    def __init__(self) -> None:
        self.decoders: dict[tuple, Any] = {}  # (drafter name, RecapConfig) -> the recap.Decoder recap.generate uses
        self.router: Any = None  # recap.catchup.router.Router
        self.prefill_lock = threading.Lock()
        self.layout: Any = None  # recap.verify.linear_layout.LinearLayout
        self.layout_choice: dict[tuple, Any] = {}  # (device, dtype, threads) -> the linear_layout.Plan measured fastest
        self.cost_curves: dict[tuple, Any] = {}  # (device, dtype, threads, layout) -> budget.CostModel
        self.conformance: tuple | None = None  # (dtype, device) the probe passed in
        self.probe_passes: dict[int, float] = {}  # its timed passes, seconds by tree size
        self.head_share: float | None = None  # the head's cost per position over a token's (recap.verify.seeding)
        # Requests on the model: a linear-layout choice deferred by a first use waits for a
        # later request that runs alone (recap.decoding.decoder), holding layout_lock while it times.
        self.layout_lock = threading.RLock()
        self._traffic = threading.Lock()
        self.served = 0  # requests finished
        self.running = 0  # requests in flight

    def enter(self) -> None:
        with self._traffic:
            self.running += 1

    def leave(self) -> None:
        with self._traffic:
            self.running -= 1
            self.served += 1

    def __deepcopy__(self, memo) -> ModelState:
        fresh = ModelState()
        if self.layout is not None:  # its copy (inactive, no weight copies) cleans the copied modules
            fresh.layout = copy.deepcopy(self.layout, memo)
        return fresh

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
