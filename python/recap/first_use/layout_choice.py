"""Which `recap.verify.linear_layout.Plan` a model's verification passes run: named by the user, or
("auto") measured once per model, device, dtype and thread count on real passes and kept in
the measurement store (`recap.state.measurements`).

The probe times passes of PROBE_TOKENS rows in the model's own products and in the trial
plans (the transposed copy for one row where the copy fits in memory, the swapped product for
more; and, for float32 weights, the Rust core's skinny product at every size), interleaved, and
picks per row class: each takes the fastest trial's product where that is GAIN faster than
the model's own.
"""

from __future__ import annotations

import math
import time

import torch

from recap._core import skinny_is_vectorised
from recap.first_use.budget import POINTS
from recap.state import measurements
from recap.state.model_state import state_of
from recap.verify.linear_layout import (
    DEFAULT,
    PLAN_NAMES,
    SKINNY,
    LinearLayout,
    Plan,
    available_memory,
    layout_of,
    skinny_fits,
)

LAYOUTS = ("auto", *PLAN_NAMES)
GAIN = 0.95  # a product replaces the model's own only if its passes take at most this share of the time
# Rows of the probe's passes: one token (where drafts do not pay) and the small trees every
# request runs (the cost curve's first points, so the curve needs no pass of its own). One
# size alone misleads: MKL's swapped product without padding took 0.73x the time at 4
# rows and 0.92x at 12. They are cost curve points, so the probe's passes price it.
PROBE_TOKENS = (1, 2, 4, 16)
assert set(PROBE_TOKENS) <= set(POINTS)
DECISIVE = 0.8  # one round of probe passes decides a class whose best product takes at most this share
MEMORY_SHARE = 0.5  # "auto" never spends more than this share of available memory on the copy


def choose(model: torch.nn.Module, probe, key: tuple, layout: str, *, warm: bool = False,
           warm_copy=None) -> Plan:
    """The plan to verify with. A plan's name is taken as given; "auto" measures
    `probe(sizes)` (one verification pass of each size, seconds by size) on CPU models, once
    per `key`; other devices keep their own. `warm`: the model has just run passes (the
    conformance probe), so the probe needs no warm-up of its own. `warm_copy()` runs once
    with the transposed copy right after it is made, untimed (default: `probe()`): the copy's
    first pass is the slow one (0.29 s against 0.21 s later on the 0.5B-shaped model), and a
    timing that took it would keep the slower plan."""
    if layout not in LAYOUTS:
        raise ValueError(f"linear_layout: expected one of {', '.join(LAYOUTS)}; got {layout!r}")
    if layout != "auto":
        return Plan.named(layout)
    candidate = layout_of(model)
    if not _eligible(model, candidate):
        return DEFAULT
    decisions = state_of(model).layout_choice
    if key not in decisions:
        kept = _stored(model)
        if kept is not None:
            decisions[key] = kept
        else:
            decisions[key] = _measure(candidate, probe, warm, warm_copy or probe, _copy_fits(candidate))
            measurements.store(_stored_as(model), decisions[key].name)
    if not decisions[key].needs_copy:
        candidate.release()
    return decisions[key]


def undecided(model: torch.nn.Module, key: tuple, layout: str) -> bool:
    """Whether `choose(model, ..., key, layout)` would time passes: "auto" on a CPU model,
    with no decision for `key` in this process or the measurement store."""
    if layout != "auto" or key in state_of(model).layout_choice:
        return False
    return _eligible(model, layout_of(model)) and _stored(model) is None


def _eligible(model: torch.nn.Module, candidate: LinearLayout) -> bool:
    """A CPU model with linear layers to route."""
    return next(model.parameters()).device.type == "cpu" and bool(candidate.modules)


def _copy_fits(candidate: LinearLayout) -> bool:
    """Whether a copy of the weights would leave the rest of the machine room (else a faster
    pass is not worth it)."""
    copy = sum(int(m.weight.numel()) * int(m.weight.element_size()) for m in candidate.modules)
    return copy <= MEMORY_SHARE * available_memory()


def _stored_as(model: torch.nn.Module) -> str:
    """The store's name for the model's decision, by what the probe times and chooses among:
    a decision taken by another probe (a yes or no for the transposed copy) is taken again."""
    return measurements.key(model, "layout", ("probe", *PROBE_TOKENS, "plans"))


def _stored(model: torch.nn.Module) -> Plan | None:
    """The plan an earlier process stored for this model, or None."""
    kept = measurements.load(_stored_as(model))
    return Plan.named(kept) if isinstance(kept, str) and kept in PLAN_NAMES else None


def _measure(candidate: LinearLayout, probe, warm: bool, warm_copy, copy_fits: bool) -> Plan:
    """The plan whose products the probe finds fastest per row class (`_pick`), timed in
    interleaved rounds so a disturbance touches every product."""
    if not warm:
        probe()  # warm-up (builds the probe's context)
    # The trial plans: the copy for one row (where it fits), the swapped product for more (a
    # swapped pass of one row would time the own again); the skinny product at every size
    # where every weight is float32. The copy for many rows is left out: it lost to the
    # swapped product at every size tried, and each plan adds to the probe's time.
    trials = [Plan("copy" if copy_fits else "own", "swapped")]
    # (Where the kernel is not vectorised, its portable loop would only lose, slowly.)
    if skinny_is_vectorised() and all(skinny_fits(m.weight) for m in candidate.modules):
        trials.append(SKINNY)
    times: dict[tuple[str, int], list[float]] = {}
    sizes: tuple[int, ...] = PROBE_TOKENS
    for round_ in range(2):
        _record(times, DEFAULT, _time(probe, sizes))
        for trial in trials:
            with candidate.using(trial):
                if trial.needs_copy and round_ == 0:
                    warm_copy()
                _record(times, trial, _time(probe, tuple(n for n in sizes if trial.product(n) != "own")))
        # A gain this wide is not noise; anything less is timed twice (keeping a slower
        # product for good costs more than one more round), at the sizes of its class only.
        plan, sizes = _pick(times)
        if not sizes:
            break
    return plan


def _record(times: dict[tuple[str, int], list[float]], plan: Plan, took: dict[int, float]) -> None:
    for n, t in took.items():
        times.setdefault((plan.product(n), n), []).append(t)


def _pick(times: dict[tuple[str, int], list[float]]) -> tuple[Plan, tuple[int, ...]]:
    """The plan, and the probe sizes of the row classes the timings do not decide at once
    (whose best product takes more than DECISIVE of the own's time). Per product and size the
    least timing counts (noise only adds time); over a class's sizes, the geometric mean of
    the ratios, so each size counts alike whatever its pass costs."""
    def ratio(product: str, sizes: tuple[int, ...]) -> float | None:
        logs = [math.log(min(times[product, n]) / min(times["own", n])) for n in sizes
                if (product, n) in times and ("own", n) in times]
        return math.exp(sum(logs) / len(logs)) if logs else None

    classes = {"one": (1,), "few": tuple(n for n in PROBE_TOKENS if n > 1)}
    chosen = {"one": "own", "few": "own"}
    undecided: tuple[int, ...] = ()
    for cls, sizes in classes.items():
        tried = {p: r for p in ("copy", "swapped", "skinny") if (r := ratio(p, sizes)) is not None}
        if not tried:  # nothing to choose from (no copy that fits, say)
            continue
        best = min(tried, key=lambda p: tried[p])
        chosen[cls] = best if tried[best] <= GAIN else "own"
        if tried[best] > DECISIVE:
            undecided += sizes
    return Plan(chosen["one"], chosen["few"]), undecided


def _time(probe, sizes: tuple[int, ...]) -> dict[int, float]:
    """Seconds by pass size where `probe(sizes)` returns them (its passes' own, not what it
    built before them, such as its context), else the whole call's (as size 0)."""
    t = time.perf_counter()
    measured = probe(sizes)
    return measured if isinstance(measured, dict) else {0: time.perf_counter() - t}
