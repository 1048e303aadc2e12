"""Runs a model's linear layers against a transposed copy of their weights, when that is faster.

A verification pass multiplies a few rows (the tree's 2-64 tokens) by every weight matrix.
Some CPU BLAS builds are much slower for such small-M products against PyTorch's [out, in]
weight layout than against [in, out]: with MKL 2024.2 on 2 threads, SmolLM2's LM head
(49152 x 576) takes 21 ms for 8 rows as `linear(x, W)` and 12 ms as `x @ W.T.contiguous()`,
while a single row costs the same either way. `LinearLayout` keeps a contiguous W^T per
layer (extra memory: one copy of the linear weights) and, while active, routes each
`nn.Linear` through it. The weights themselves are never modified. Whether to use it is
measured per model, device, dtype and thread count on a real verification pass.
"""

from __future__ import annotations

import os
import threading
import time
import weakref

import numpy as np
import torch

LAYOUTS = ("auto", "default", "transposed")
GAIN = 0.95  # use the transposed layout only if a pass takes at most this share of the time
PROBE_TOKENS = 12  # rows of the probe pass: a typical tree on a CPU
MEMORY_SHARE = 0.5  # "auto" never spends more than this share of available memory on the copy
# Per model (weakly held, like the cost curves): model -> {key: use the transposed layout}.
_DECISIONS: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, bool]] = weakref.WeakKeyDictionary()
_ATTR = "_recap_linear_layout"


def available_memory() -> int:
    """Bytes of memory available now (Linux and macOS; unbounded where unknown)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


class _TransposedForward:
    """A module's forward while its layout is active: x @ (a copy of W^T) + b. A plain
    object rather than a closure, so that copy.deepcopy and pickle of an active model work."""

    def __init__(self, module: torch.nn.Linear, wt: torch.Tensor) -> None:
        self.module = module
        self.wt = wt

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.wt
        bias = self.module.bias
        return y if bias is None else y + bias


class LinearLayout:
    """Context manager: while active, every `nn.Linear` of `model` runs as x @ W^T (copy).

    One per model (`layout_of`), shared by every decoder on it: activations nest and count
    across decoders and threads, so one decoder finishing never switches the layout off under
    another. Each layout owns its copies, so another layout on the same model (or its release)
    cannot take them away."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.modules = [m for m in model.modules() if type(m) is torch.nn.Linear]
        self._copies: list[torch.Tensor] = []
        self._versions: list[int] = []
        self._depth = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:  # copy.deepcopy(model) copies the layout with it
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        return sum(wt.numel() * wt.element_size() for wt in self._copies)

    def _refresh(self) -> None:
        versions = [m.weight._version for m in self.modules]
        if versions != self._versions:  # first use, or the weights were changed in place
            with torch.no_grad():
                self._copies = [m.weight.detach().T.contiguous() for m in self.modules]
            self._versions = versions

    def __enter__(self) -> LinearLayout:
        with self._lock:
            if self._depth == 0:
                self._refresh()
                for m, wt in zip(self.modules, self._copies, strict=True):
                    m.forward = _TransposedForward(m, wt)
            self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                for m in self.modules:
                    m.__dict__.pop("forward", None)

    def release(self) -> None:
        """Drops the transposed copies (unless active; the next activation rebuilds them)."""
        with self._lock:
            if self._depth:
                return
            self._copies = []
            self._versions = []


def layout_of(model: torch.nn.Module) -> LinearLayout:
    """The model's one `LinearLayout`, created on first request."""
    found = model.__dict__.get(_ATTR)
    if found is None:
        found = LinearLayout(model)
        model.__dict__[_ATTR] = found
    return found


def choose(model: torch.nn.Module, probe, key: tuple, layout: str) -> LinearLayout | None:
    """The layout to verify with: None for the model's own. "auto" measures `probe()` (one
    verification pass) both ways on CPU models whose weight copy fits in MEMORY_SHARE of the
    available memory, once per `key`; other devices keep their own."""
    if layout not in LAYOUTS:
        raise ValueError(f"linear_layout: expected one of {', '.join(LAYOUTS)}; got {layout!r}")
    if layout == "default":
        return None
    candidate = layout_of(model)
    if layout == "transposed":
        return candidate
    if next(model.parameters()).device.type != "cpu" or not candidate.modules:
        return None
    copy = sum(m.weight.numel() * m.weight.element_size() for m in candidate.modules)
    if copy > MEMORY_SHARE * available_memory():
        return None  # the copy would crowd out the rest of the machine: not worth a faster pass
    decisions = _DECISIONS.setdefault(model, {})
    if key not in decisions:
        probe()  # warm-up (builds the probe's context)
        own, flipped = [], []
        for _ in range(3):
            own.append(_time(probe))
            with candidate:
                flipped.append(_time(probe))
        decisions[key] = float(np.median(flipped)) <= GAIN * float(np.median(own))
    if decisions[key]:
        return candidate
    candidate.release()
    return None


def _time(probe) -> float:
    t = time.perf_counter()
    probe()
    return time.perf_counter() - t
