"""Runs a model's linear layers against a transposed copy of their weights, when that is faster.

A verification pass multiplies a few rows (the tree's 2-64 tokens) by every weight matrix.
Some CPU BLAS builds are much slower for such small-M products against PyTorch's [out, in]
weight layout than against [in, out]: with MKL 2024.2 on 2 threads, SmolLM2's LM head
(49152 x 576) takes 21 ms for 8 rows as `linear(x, W)` and 12 ms as `x @ W.T.contiguous()`,
while a single row costs the same either way (with torch 2.15 on the same VM, whole passes
of SmolLM2 past one token are faster in the model's own layout, and the probe keeps it).
`LinearLayout` keeps a contiguous W^T per layer (extra memory: one copy of the linear
weights) and, while active, routes each `nn.Linear` through it. The weights themselves are
never modified. Whether to use it is measured per model, device, dtype and thread count on
real verification passes.
"""

from __future__ import annotations

import copy
import math
import os
import threading
import time

import torch

from recap import measurements
from recap._core import transpose_into
from recap.model_state import state_of

LAYOUTS = ("auto", "default", "transposed")
GAIN = 0.95  # use the transposed layout only if a pass takes at most this share of the time
# Rows of the probe's passes: the two ends of what decoding runs on a CPU (one token where
# drafts do not pay, a typical tree where they do). One size alone misleads: on the
# 0.5B-shaped model one afternoon the transposed layout took 0.77x the time at 1 token and
# 0.95x at 12, and decoding ran 20% faster in it.
PROBE_TOKENS = (1, 12)
DECISIVE = 0.8  # one pair of probe passes decides when the transposed takes at most this share of the time
MEMORY_SHARE = 0.5  # "auto" never spends more than this share of available memory on the copy


_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # a weight's bits, by element size


def transposed(w: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of W^T. On the CPU the Rust core's blocked transpose does it, on
    torch's thread count (2.4x faster than `w.T.contiguous()`, whose strided walk is most
    of a first use's weight copy: 0.56-0.61 s against 1.37-1.45 s for a 0.5B model's 2 GB
    on the 2-core VM); elsewhere torch does."""
    w = w.detach()
    bits = _BITS.get(w.element_size())
    if w.device.type != "cpu" or w.dim() != 2 or not w.is_contiguous() or bits is None or w.is_complex():
        return w.T.contiguous()
    wt = torch.empty((w.shape[1], w.shape[0]), dtype=w.dtype)
    as_bits = lambda t: t.view(bits).numpy().view(f"uint{8 * t.element_size()}")  # noqa: E731
    transpose_into(as_bits(w), as_bits(wt), torch.get_num_threads())
    return wt


def available_memory() -> int:
    """Bytes of memory available now (Linux and macOS; unbounded where unknown)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


class _TransposedForward:
    """A module's forward while its layout is active: x @ (a copy of W^T) + b, but only for
    the threads that activated the layout and only without autograd; any other call (another
    thread using the model meanwhile, a backward pass to come) runs the module's own forward,
    so no gradient is cut and nobody else sees the swapped path."""

    def __init__(self, module: torch.nn.Linear, wt: torch.Tensor, layout: LinearLayout) -> None:
        self.module = module
        self.wt = wt
        self.layout = layout

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        if threading.get_ident() not in self.layout._threads or (
                torch.is_grad_enabled() and (x.requires_grad or m.weight.requires_grad)):
            return type(m).forward(m, x)
        y = x @ self.wt
        return y if m.bias is None else y + m.bias

    def __deepcopy__(self, memo) -> _OwnForward:
        # A copy of a model made while the layout is active gets the plain forward (no copy
        # of W^T); the copy's layout removes it once the copy is complete (see __setstate__).
        return _OwnForward(copy.deepcopy(self.module, memo))


class _OwnForward:
    """The module's own forward, standing in for a transposed one inside a deepcopy."""

    def __init__(self, module: torch.nn.Linear) -> None:
        self.module = module

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return type(self.module).forward(self.module, x)


def _patchable(m: torch.nn.Module) -> bool:
    """Plain `nn.Linear` modules only: never one that already carries an instance forward or
    hooks (accelerate's offloading, a user's own), which would be overridden or bypassed."""
    return (type(m) is torch.nn.Linear and "forward" not in m.__dict__ and not m._forward_hooks
            and not m._forward_pre_hooks)


class LinearLayout:
    """Context manager: while active, every `nn.Linear` of `model` runs as x @ W^T (copy).

    One per model (`layout_of`), shared by every decoder on it: activations nest and count
    across decoders and threads, so one decoder finishing never switches the layout off under
    another. Each layout owns its copies, so another layout on the same model (or its release)
    cannot take them away."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.modules: list[torch.nn.Linear] = [m for m in model.modules()
                                               if isinstance(m, torch.nn.Linear) and _patchable(m)]
        self._copies: list[torch.Tensor] = []
        self._versions: list[int] = []
        self._depth = 0
        self._threads: dict[int, int] = {}  # activations per thread
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:  # copy.deepcopy(model) copies the layout with it: inactive, no copies
        state = dict(self.__dict__)
        del state["_lock"]
        state.update(_copies=[], _versions=[], _depth=0, _threads={})
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        for m in self.modules:  # the model's modules were copied before this layout: clean them
            if isinstance(m.__dict__.get("forward"), _OwnForward):
                del m.__dict__["forward"]

    @property
    def active(self) -> bool:
        """Whether this thread's linear layers run transposed now."""
        return threading.get_ident() in self._threads

    @property
    def bytes(self) -> int:
        return sum(wt.numel() * wt.element_size() for wt in self._copies)

    def _refresh(self) -> None:
        versions = [m.weight._version for m in self.modules]
        if versions != self._versions:  # first use, or the weights were changed in place
            with torch.no_grad():
                self._copies = [transposed(m.weight) for m in self.modules]
            self._versions = versions

    def __enter__(self) -> LinearLayout:
        with self._lock:
            if self._depth == 0:
                self._refresh()
                for m, wt in zip(self.modules, self._copies, strict=True):
                    if _patchable(m):  # hooks added since are left alone
                        m.forward = _TransposedForward(m, wt, self)  # type: ignore[method-assign,assignment]
            self._depth += 1
            me = threading.get_ident()
            self._threads[me] = self._threads.get(me, 0) + 1
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            me = threading.get_ident()
            self._threads[me] -= 1
            if not self._threads[me]:
                del self._threads[me]
            self._depth -= 1
            if self._depth == 0:
                for m in self.modules:
                    if isinstance(m.__dict__.get("forward"), _TransposedForward):
                        del m.__dict__["forward"]

    def release(self) -> None:
        """Drops the transposed copies (unless active; the next activation rebuilds them)."""
        with self._lock:
            if self._depth:
                return
            self._copies = []
            self._versions = []


def layout_of(model: torch.nn.Module) -> LinearLayout:
    """The model's one `LinearLayout`, created on first request."""
    state = state_of(model)
    if state.layout is None:
        state.layout = LinearLayout(model)
    return state.layout


def choose(model: torch.nn.Module, probe, key: tuple, layout: str, *, warm: bool = False,
           warm_copy=None) -> LinearLayout | None:
    """The layout to verify with: None for the model's own. "auto" measures `probe()` (one
    verification pass of each of PROBE_TOKENS' sizes) both ways, in two interleaved pairs
    (one where the first shows a DECISIVE gain), on CPU models whose weight copy fits in
    MEMORY_SHARE of the available memory, once per `key`; other devices keep their own. `warm`: the model has just run
    passes (the conformance probe), so the probe needs no warm-up of its own.
    `warm_copy()` runs once in the transposed layout right after the copy is made, untimed
    (default: `probe()`): the copy's first pass is the slow one (0.29 s against 0.21 s later
    on the 0.5B-shaped model), and a timing that took it would keep the slower layout."""
    if layout not in LAYOUTS:
        raise ValueError(f"linear_layout: expected one of {', '.join(LAYOUTS)}; got {layout!r}")
    if layout == "default":
        return None
    candidate = layout_of(model)
    if layout == "transposed":
        return candidate
    if not _eligible(model, candidate):
        return None
    decisions = state_of(model).layout_choice
    if key not in decisions:
        kept = _stored(model)
        if kept is not None:
            decisions[key] = kept
        else:
            decisions[key] = _measure(candidate, probe, warm, warm_copy or probe)
            measurements.store(_stored_as(model), decisions[key])
    if decisions[key]:
        return candidate
    candidate.release()
    return None


def undecided(model: torch.nn.Module, key: tuple, layout: str) -> bool:
    """Whether `choose(model, ..., key, layout)` would time passes: "auto" on a CPU model
    whose copy fits, with no decision for `key` in this process or the measurement store."""
    if layout != "auto" or key in state_of(model).layout_choice:
        return False
    return _eligible(model, layout_of(model)) and _stored(model) is None


def _eligible(model: torch.nn.Module, candidate: LinearLayout) -> bool:
    """A CPU model with linear layers to transpose, whose copy would not crowd out the rest
    of the machine (then a faster pass is not worth it)."""
    if next(model.parameters()).device.type != "cpu" or not candidate.modules:
        return False
    copy = sum(int(m.weight.numel()) * int(m.weight.element_size()) for m in candidate.modules)
    return copy <= MEMORY_SHARE * available_memory()


def _stored_as(model: torch.nn.Module) -> str:
    """The store's name for the model's decision, by what the probe times: a decision taken by
    another probe (one 12-token pass, timed with its context's prefill) is taken again."""
    return measurements.key(model, "layout", ("probe", *PROBE_TOKENS))


def _stored(model: torch.nn.Module) -> bool | None:
    """The decision an earlier process stored for this model, or None."""
    kept = measurements.load(_stored_as(model))
    return kept if isinstance(kept, bool) else None


def _measure(candidate: LinearLayout, probe, warm: bool, warm_copy) -> bool:
    """Whether the transposed layout is GAIN faster on `probe`, timed in interleaved pairs."""
    if not warm:
        probe()  # warm-up (builds the probe's context)
    own: list[dict[int, float]] = []
    flipped: list[dict[int, float]] = []
    for _ in range(2):  # interleaved, so a disturbance touches both layouts
        own.append(_time(probe))
        with candidate:
            if not flipped:
                warm_copy()
            flipped.append(_time(probe))
        # A gain this wide is not noise; a loss is timed twice (keeping the slower
        # layout for good costs more than a copy kept for nothing).
        if _ratio(flipped, own) <= DECISIVE:
            break
    return _ratio(flipped, own) <= GAIN


def _ratio(flipped: list[dict[int, float]], own: list[dict[int, float]]) -> float:
    """The transposed layout's time over the model's own: per pass size, the least of each
    layout's timings (noise only adds time); over the sizes, the geometric mean, so each end
    of what decoding runs counts alike whatever its pass costs."""
    logs = [math.log(min(t[n] for t in flipped) / min(t[n] for t in own)) for n in own[0]]
    return math.exp(sum(logs) / len(logs))


def _time(probe) -> dict[int, float]:
    """Seconds by pass size where `probe()` returns them (its passes' own, not what it built
    before them, such as its context), else the whole call's (as size 0)."""
    t = time.perf_counter()
    measured = probe()
    return measured if isinstance(measured, dict) else {0: time.perf_counter() - t}
