"""Runs a model's linear layers as whichever product of the same weights is fastest for the
number of rows a pass multiplies.

A verification pass multiplies a few rows (the tree's 2-64 tokens) by every weight matrix, and
CPU BLAS builds differ widely in how fast they do that for each way of writing the product.
With MKL 2024.2 on 2 threads and SmolLM2-135M, a whole verification pass of 4 tokens takes
90 ms as the model's own `linear(x, W)` (x @ W^T), 97 ms as `x @ W.T.contiguous()` (a copy)
and 66 ms as `(W @ x^T)^T` (no copy); one token takes 56, 49 and 56 ms. The products:

- ``own``: the module's own forward.
- ``copy``: x @ (a contiguous copy of W^T); extra memory: one copy of the linear weights.
- ``swapped``: (W @ x^T)^T on the weight as it is (no copy): used for 2..FEW_ROWS rows only.
- ``skinny``: the Rust core's `skinny_matmul` on the weight as it is (no copy; float32 only,
  any other dtype runs the own): it reads each weight once per pass whatever the rows, where
  BLAS products built for large matrices leave bandwidth unused (SmolLM2-135M's 211 products,
  2-core VM, medians of 7 interleaved rounds: 45 / 55 / 57 / 67 / 88 ms for 1 / 2 / 4 / 8 / 16
  rows against the swapped product's 78 / 58 / 65 / 95 / 111 and the own's 76 ms for one row;
  reading the weights once takes 28).

A `Plan` names the product for one row and the one for 2..FEW_ROWS rows; past FEW_ROWS (a
prefill) every plan runs the module's own forward, so prompts are processed as `generate`
processes them. The weights themselves are never modified. Which plan to use is measured per
model, device, dtype and thread count on real verification passes.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import os
import threading
from dataclasses import dataclass

import torch

from recap._core import _use_openmp, skinny_matmul, transpose_into
from recap.state.model_state import state_of

PRODUCTS = ("own", "copy", "swapped", "skinny")
ONE_ROW = ("own", "copy", "skinny")  # the products a pass of one row can run (swapped: the own)
FEW_ROWS = 64  # the most rows the swapped product runs for: past it (a prompt) MKL's own is faster
_NAMES = {"own": "default", "copy": "transposed", "swapped": "swapped", "skinny": "skinny"}


@dataclass(frozen=True)
class Plan:
    """The product a pass of one row runs (`one`: own, copy or skinny) and the one a pass of
    2..FEW_ROWS rows runs (`few`: own, copy, swapped or skinny)."""

    one: str = "own"
    few: str = "own"

    def __post_init__(self) -> None:
        if self.one not in ONE_ROW or self.few not in PRODUCTS:
            raise ValueError(f"Plan: expected one in {', '.join(ONE_ROW)} and few in {', '.join(PRODUCTS)}; "
                             f"got one={self.one!r}, few={self.few!r}")

    def product(self, rows: int) -> str:
        if rows < 2:
            return self.one if rows == 1 else "own"
        return self.few if rows <= FEW_ROWS else "own"

    @property
    def needs_copy(self) -> bool:
        return "copy" in (self.one, self.few)

    @property
    def name(self) -> str:
        """"default", "transposed", "swapped" or "skinny" where one product serves both (a swapped
        product of one row is the own), else the one-row product's name and the few-row
        one's joined by "+" ("transposed+swapped")."""
        one, few = _NAMES[self.one], _NAMES[self.few]
        if one == few or self.few == "swapped" and self.one == "own":  # one row: swapped is own
            return few
        return f"{one}+{few}"

    @staticmethod
    def named(name: str) -> Plan:
        """The plan `name` names (what `name` gives back)."""
        if name not in _BY_NAME:
            raise ValueError(f"linear layout: expected one of {', '.join(PLAN_NAMES)}; got {name!r}")
        return _BY_NAME[name]


DEFAULT = Plan("own", "own")
TRANSPOSED = Plan("copy", "copy")
SWAPPED = Plan("own", "swapped")
SKINNY = Plan("skinny", "skinny")
_BY_NAME = {plan.name: plan for plan in (Plan(one, few) for one in ONE_ROW for few in PRODUCTS)}
PLAN_NAMES = tuple(_BY_NAME)


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


def _swapped(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x @ w^T as (w @ x^T)^T, contiguous (the next reshapes expect it and run faster on it).
    Rows past a multiple of 16 by more than 8 are padded with zeros to the next one: MKL's
    product runs blocks of 16 rows fast and the rest slowly (SmolLM2's MLP up-projection:
    451 us at 12 rows, 254 at 16; its head 17.9 ms and 13.6)."""
    n = x.shape[0]
    if n % 16 > 8:
        x = torch.cat([x, x.new_zeros(16 - n % 16, x.shape[1])])
        return torch.mm(w, x.t())[:, :n].t().contiguous()
    return torch.mm(w, x.t()).t().contiguous()


def skinny_fits(w: torch.Tensor) -> bool:
    """Whether the skinny product runs for weight `w` (else the module's own does)."""
    return w.dtype == torch.float32 and w.device.type == "cpu" and w.dim() == 2 and w.is_contiguous()


@functools.cache
def _on_torchs_threads() -> bool:
    """Hands the skinny product's threads to torch's OpenMP runtime, once: a second set of
    threads spinning beside torch's team on the same cores made a whole SmolLM2 pass of
    1-16 tokens 1.7-2.1x slower. Where torch runs another backend, or the runtime's entry
    points are not in the process's global symbols, the kernel keeps its own helpers."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return False
    try:
        lib = ctypes.CDLL(None)
        names = ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads")
        addresses = [ctypes.cast(getattr(lib, n), ctypes.c_void_p).value or 0 for n in names]
    except (AttributeError, OSError):
        return False
    return bool(_use_openmp(*addresses))


def _skinny(w, x: torch.Tensor) -> torch.Tensor:
    """x @ w^T by the Rust core's kernel for few rows, on torch's thread count; `w` is the
    weight's numpy view (`LinearLayout._views`: made once, not per call)."""
    x = x.contiguous()
    y = torch.empty((x.shape[0], w.shape[0]), dtype=torch.float32)
    skinny_matmul(w, x.numpy(), y.numpy(), torch.get_num_threads())
    return y


class _RoutedForward:
    """A module's forward while its layout is active: the product the plan of the calling
    thread names for the rows of `x`, but only for threads that activated the layout and only
    without autograd; any other call (another thread using the model meanwhile, a backward
    pass to come) runs the module's own forward, so no gradient is cut and nobody else sees
    another path."""

    def __init__(self, module: torch.nn.Linear, index: int, layout: LinearLayout) -> None:
        self.module = module
        self.index = index  # of the module's copy in the layout's copies
        self.layout = layout

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        m = self.module
        plans = self.layout._threads.get(threading.get_ident())
        if not plans or (torch.is_grad_enabled() and (x.requires_grad or m.weight.requires_grad)):
            return type(m).forward(m, x)
        rows = x.numel() // x.shape[-1] if x.numel() else 0
        product = plans[-1].product(rows)
        if product == "copy":
            y = x @ self.layout._copies[self.index]
        elif product == "swapped":
            y = _swapped(m.weight, x.reshape(rows, x.shape[-1])).view(*x.shape[:-1], m.weight.shape[0])
        elif product == "skinny" and x.dtype == torch.float32 and (w := self.layout._views[self.index]) is not None:
            y = _skinny(w, x.reshape(rows, x.shape[-1])).view(*x.shape[:-1], m.weight.shape[0])
        else:
            return type(m).forward(m, x)
        return y if m.bias is None else y + m.bias

    def __deepcopy__(self, memo) -> _OwnForward:
        # A copy of a model made while the layout is active gets the plain forward (no copy
        # of W^T); the copy's layout removes it once the copy is complete (see __setstate__).
        return _OwnForward(copy.deepcopy(self.module, memo))


class _OwnForward:
    """The module's own forward, standing in for a routed one inside a deepcopy."""

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
    """While a plan is active (`using(plan)`), every `nn.Linear` of `model` runs the product
    the plan names for its rows; `with layout:` activates TRANSPOSED.

    One per model (`layout_of`), shared by every decoder on it: activations nest and count
    across decoders and threads (each thread runs its innermost plan), so one decoder
    finishing never switches the layout off under another. Each layout owns its copies of
    W^T (made when a plan that needs them is first activated), so another layout on the same
    model (or its release) cannot take them away."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.modules: list[torch.nn.Linear] = [m for m in model.modules()
                                               if isinstance(m, torch.nn.Linear) and _patchable(m)]
        self._copies: list[torch.Tensor] = []
        self._versions: list[int] = []
        # Each weight's numpy view for the skinny product (None where it cannot run), by the
        # weights' addresses when made: a weight replaced since gets a new view.
        self._views: list = [None] * len(self.modules)
        self._view_addresses: list[int] = []
        self._depth = 0
        self._threads: dict[int, list[Plan]] = {}  # each thread's active plans, innermost last
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:  # copy.deepcopy(model) copies the layout with it: inactive, no copies
        state = dict(self.__dict__)
        del state["_lock"]
        state.update(_copies=[], _versions=[], _views=[None] * len(self.modules), _view_addresses=[], _depth=0,
                     _threads={})
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        for m in self.modules:  # the model's modules were copied before this layout: clean them
            if isinstance(m.__dict__.get("forward"), _OwnForward):
                del m.__dict__["forward"]

    @property
    def active(self) -> bool:
        """Whether this thread's linear layers run a plan now."""
        return threading.get_ident() in self._threads

    @property
    def plan(self) -> Plan:
        """The plan this thread's linear layers run now (DEFAULT where none is active)."""
        plans = self._threads.get(threading.get_ident())
        return plans[-1] if plans else DEFAULT

    @property
    def bytes(self) -> int:
        return sum(wt.numel() * wt.element_size() for wt in self._copies)

    def _refresh(self) -> None:
        versions = [m.weight._version for m in self.modules]
        if versions != self._versions:  # first use, or the weights were changed in place
            with torch.no_grad():
                self._copies = [transposed(m.weight) for m in self.modules]
            self._versions = versions

    def _refresh_views(self) -> None:
        addresses = [m.weight.data_ptr() for m in self.modules]
        if addresses != self._view_addresses:
            self._views = [m.weight.detach().numpy() if skinny_fits(m.weight) else None for m in self.modules]
            self._view_addresses = addresses
        _on_torchs_threads()

    def using(self, plan: Plan) -> _Activation:
        """A context in which this thread's linear layers run `plan`."""
        return _Activation(self, plan)

    def __enter__(self) -> LinearLayout:
        self._enter(TRANSPOSED)
        return self

    def __exit__(self, *exc) -> None:
        self._exit()

    def _enter(self, plan: Plan) -> None:
        with self._lock:
            if plan.needs_copy:
                self._refresh()
            if "skinny" in (plan.one, plan.few):
                self._refresh_views()
            if self._depth == 0:
                for i, m in enumerate(self.modules):
                    if _patchable(m):  # hooks added since are left alone
                        m.forward = _RoutedForward(m, i, self)  # type: ignore[method-assign,assignment]
            self._depth += 1
            self._threads.setdefault(threading.get_ident(), []).append(plan)

    def _exit(self) -> None:
        with self._lock:
            me = threading.get_ident()
            self._threads[me].pop()
            if not self._threads[me]:
                del self._threads[me]
            self._depth -= 1
            if self._depth == 0:
                for m in self.modules:
                    if isinstance(m.__dict__.get("forward"), _RoutedForward):
                        del m.__dict__["forward"]

    def release(self) -> None:
        """Drops the transposed copies (unless active; the next activation that needs them
        rebuilds them)."""
        with self._lock:
            if self._depth:
                return
            self._copies = []
            self._versions = []
            self._views, self._view_addresses = [None] * len(self.modules), []


class _Activation:
    def __init__(self, layout: LinearLayout, plan: Plan) -> None:
        self.layout, self.plan = layout, plan

    def __enter__(self) -> LinearLayout:
        self.layout._enter(self.plan)
        return self.layout

    def __exit__(self, *exc) -> None:
        self.layout._exit()


def layout_of(model: torch.nn.Module) -> LinearLayout:
    """The model's one `LinearLayout`, created on first request."""
    state = state_of(model)
    if state.layout is None:
        state.layout = LinearLayout(model)
    return state.layout
