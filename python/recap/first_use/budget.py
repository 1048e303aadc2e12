"""The measurement behind ``budget="auto"``: the verification cost c(n) at a few sizes.

c(n) is the time of one verification pass over n tree tokens (root included), top-k and the
device-to-host copy included, exactly as a decoding step runs it. At first use it is measured
only for the small trees every request needs (POINTS: 1, 2, 4, 8, 12 and 16 tokens) and handed to
the drafter (`Drafter.set_cost_points`). No single pass decides a point: each size gets one
untimed pass (a new shape's first pass builds its kernels), then REPS timed passes in
interleaved rounds (a disturbance touches every size, not one), and the point is their
median; a pass the conformance or layout probe timed stands for the untimed pass and is one
of the REPS samples (the shape has run: first use pays no pass twice). The curve
is made non-decreasing in n. It is kept with the model for the process, once per model,
device, dtype, thread count and linear layout.

The controller itself is Rust (`recap_core::cost`, `recap_core::budget`): it corrects the
curve online from every step's timings (the true cost also grows with the context length),
extends it with the real passes the controller asks for past its last point, adds the host
time per step, and cuts each tree to the prefix with the most expected committed tokens per
second; its backoff judges drafting by measured step times, not by the curve.

Only a curve decoding has confirmed is stored for later processes (`recap.state.measurements`):
once a request's online curve has seen HEAL_AFTER steps, `settle` stores the first-use
curve if decoding agrees with it, or the corrected one if decoding shows it wrong (a curve
measured while the machine was busy, one a long context outgrew). Each stored point says
how many real passes back it; a stored curve that decoding contradicts is replaced.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from recap.state import measurements
from recap.state.model_state import state_of

# The sizes the curve is measured at, every one a size trees are then filled to: between
# points the controller prices a tree at the next point's time (`recap_core::cost`), since on
# a CPU the sizes between can cost more than the point (SmolLM2, 2-core VM: 3 tokens cost
# 1.15x what 4 do, 9 about 1.1x what 16 do; MKL multiplies blocks of 4 and 16 rows fast,
# recap.verify.linear_layout). 2 is its own point: on a CPU a 2-token pass can cost about what
# a 1-token pass does. 1, 2, 4 and 16 are the linear-layout probe's sizes
# (recap.first_use.layout_choice.PROBE_TOKENS): where it ran, its passes are samples of them.
# Past 16 the curve grows online from the real passes the controller asks for.
POINTS = (1, 2, 4, 8, 12, 16)
# Timed passes per point at first use (after one untimed pass per size); the median counts.
REPS = 3
# Context tokens in the cache while measuring (the online corrections follow real contexts).
# Its prefill is a first-use cost: 64 tokens took 0.35 s on the 0.5B-shaped model, 16 take 0.23.
CALIBRATION_PAST = 16
# A curve is settled (stored, or replaced by what decoding measured) once the online curve
# has seen HEAL_AFTER steps; it is wrong when a point that HEAL_SEEN real passes corrected is
# HEAL_OFF (relative) away from it, or such a point lies past its last one.
HEAL_AFTER = 64
HEAL_SEEN = 8
HEAL_OFF = 0.25


@dataclass(frozen=True)
class CostModel:
    """Measured pass times: `seconds[i]` for a pass over `points[i]` tree tokens."""

    points: list[int]
    seconds: list[float]
    #: Decoding steps that confirmed it (0: measured at first use, not yet confirmed).
    confirmed_by: int = 0
    #: Real passes that back each point (first-use samples, or online corrections).
    passes: tuple[int, ...] = ()

    def stored(self) -> dict:
        return {"points": self.points, "seconds": self.seconds, "confirmed_by": self.confirmed_by,
                "passes": list(self.passes)}


def _monotone(y: np.ndarray) -> np.ndarray:
    """Non-decreasing in n: each value becomes the least of itself and every larger pass.
    Timing noise only ever adds time, so an outlier is pulled down to what a bigger pass
    took, and the points after it keep their values."""
    return np.minimum.accumulate(np.asarray(y, dtype=np.float64)[::-1])[::-1]


def model_key(model: torch.nn.Module) -> tuple:
    """What a timing on `model` depends on besides the model itself: device, dtype, threads."""
    p = next(model.parameters())
    return (str(p.device), str(p.dtype), torch.get_num_threads())


def _confirmed(kept: Any) -> CostModel | None:
    """A stored curve, if it is one decoding confirmed (anything else is measured again)."""
    if not (isinstance(kept, dict) and kept.get("points") and kept.get("confirmed_by", 0) >= HEAL_AFTER):
        return None
    try:
        points, seconds = [int(p) for p in kept["points"]], [float(t) for t in kept["seconds"]]
        backed = tuple(int(n) for n in kept.get("passes", ()))
    except (TypeError, ValueError):
        return None
    if len(points) != len(seconds) or not all(t > 0 for t in seconds):
        return None
    return CostModel(points, seconds, int(kept["confirmed_by"]), backed)


def cost_model(model: torch.nn.Module, new_pass, max_tokens: int, *, variant: tuple = (),
               refresh: bool = False, reps: int = REPS, passes: ChainPasses | None = None,
               known: dict[int, float] | None = None,
               points: tuple[int, ...] = POINTS) -> CostModel:
    """The cached cost model of `model` (measured now if missing, or if `refresh`).

    `new_pass(capacity)` makes a `recap.verify.tree_pass.TreePass` of the model (the pass decoding
    runs), with the token ids never to feed (image placeholders) as `new_pass.excluded`.
    `variant` names anything else the passes depend on (the linear layout they run in).
    `passes`, when given, is a context already built (the first use's, shared with the
    layout probe) to measure in, if it holds the largest point; `known` holds points
    measured there already (the layout probe's passes, in the layout chosen: one sample each).
    `points`: the sizes to take
    (the controller extends the curve online past the last). A curve measured here is not
    stored; `settle` stores it once decoding confirms it."""
    per_model = state_of(model).cost_curves  # with the model: it goes when the model goes
    key = model_key(model) + tuple(variant)
    found = per_model.get(key)
    covers = min(max_tokens, points[-1])
    if found is not None and not refresh and found.points[-1] >= covers:
        return found
    stored_as = measurements.key(model, "cost", tuple(variant))
    kept = None if refresh else _confirmed(measurements.load(stored_as))  # an earlier process's
    if kept is not None and kept.points[-1] >= covers:
        per_model[key] = kept
        return kept
    sizes = sorted({p for p in points if p < covers} | {covers})
    if passes is None or passes.max_tokens < sizes[-1]:
        passes = ChainPasses(model, new_pass, sizes[-1])
    samples = _measure(passes, sizes, reps, known)
    seconds = _monotone(np.asarray([float(np.median(samples[p])) for p in sizes])).tolist()
    per_model[key] = CostModel(sizes, seconds, 0, tuple(len(samples[p]) for p in sizes))
    return per_model[key]


def settle(model: torch.nn.Module, variant: tuple, state: dict | None) -> CostModel | None:
    """Settles the cost curve kept for `model` against what decoding measured (`state`: a
    session's `cost_state()`), once the online curve has seen HEAL_AFTER steps. A first-use
    curve decoding agrees with is stored, confirmed, for later processes; a kept curve
    decoding shows wrong (measured while the machine was busy, or at a short context that
    long requests outgrow) is replaced, with the model and in the store, by the one the
    controller now prices with: each point corrected by at least HEAL_SEEN real passes takes
    its corrected time, the others the global correction, as the controller prices them; a
    point added online that few passes saw is left out. Returns the curve stored, or None."""
    if not state or state.get("observed_steps", 0) < HEAL_AFTER:
        return None
    per_model = state_of(model).cost_curves
    key = model_key(model) + tuple(variant)
    kept = per_model.get(key)
    if kept is None:
        return None
    points, ms = list(state["points"]), list(state["ms"])
    ratio, seen, overall = list(state["online_ratio"]), list(state["seen"]), float(state["global_ratio"])
    steps = int(state["observed_steps"])
    new_points, new_seconds, backed, wrong = [], [], [], False
    for p, t, r, n in zip(points, ms, ratio, seen, strict=True):
        well_seen = n >= HEAL_SEEN
        if p not in kept.points and not well_seen:
            continue
        value = t / 1e3 * (r if well_seen else overall)
        # A point past the kept curve's last is new evidence; one within it is compared
        # with the kept curve's interpolation.
        if well_seen and (p > kept.points[-1]
                          or abs(value / float(np.interp(p, kept.points, kept.seconds)) - 1.0) > HEAL_OFF):
            wrong = True
        new_points.append(int(p))
        new_seconds.append(value)
        backed.append(int(n) if well_seen else steps)
    if wrong:
        settled = CostModel(new_points, _monotone(np.asarray(new_seconds)).tolist(), steps, tuple(backed))
    elif kept.confirmed_by == 0:
        settled = CostModel(kept.points, kept.seconds, steps, kept.passes)
    else:
        return None  # a confirmed curve decoding agrees with: nothing to write
    per_model[key] = settled
    measurements.store(measurements.key(model, "cost", tuple(variant)), settled.stored())
    return settled


class ChainPasses:
    """Verification passes over random chains after a fixed random context of
    CALIBRATION_PAST tokens, run by the decoder's own tree pass (`TreePass.chain`)."""

    def __init__(self, model: Any, new_pass, max_tokens: int = POINTS[-1]) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.vocab = model.get_output_embeddings().weight.shape[0]
        self.gen = torch.Generator().manual_seed(0)
        self.excluded = torch.tensor(sorted(getattr(new_pass, "excluded", ())), dtype=torch.long)
        self.max_tokens = max_tokens
        self.runs = 0
        self.tree_pass = new_pass(CALIBRATION_PAST + max_tokens, max_tokens)
        with torch.no_grad():
            self.tree_pass.prefill(self.draw(CALIBRATION_PAST), None, {})

    def draw(self, n: int) -> torch.Tensor:
        # Random text tokens; never an image placeholder (it would read as an image prompt).
        t = torch.randint(3, max(self.vocab - 1, 4), (1, n), generator=self.gen)
        return t.masked_fill(torch.isin(t, self.excluded), 3).to(self.device)

    @torch.no_grad()
    def run(self, tokens: torch.Tensor) -> float:
        """Seconds of one pass over `tokens` (the cache is left as it was)."""
        ids = tokens[0].tolist()  # the host side of a step: the drafter writes host buffers
        self.runs += 1
        t = time.perf_counter()
        self.tree_pass.chain(ids)
        return time.perf_counter() - t


def _measure(passes: ChainPasses, points: list[int], reps: int,
             known: dict[int, float] | None = None) -> dict[int, list[float]]:
    """`reps` samples at each point, timed in interleaved rounds (one size after the other, so
    a disturbance lands on every size alike), after one untimed pass at each size: the first
    pass of a new shape is the slow one, whatever ran before. A size in `known` (a probe's
    pass: the shape has run) skips the untimed pass and counts that pass as one sample."""
    known = {n: t for n, t in (known or {}).items() if n in points}
    chains = {n: passes.draw(n) for n in points}
    for n in points:
        if n not in known:
            passes.run(chains[n])
    out: dict[int, list[float]] = {n: [known[n]] if n in known else [] for n in points}
    for round_ in range(max(1, reps)):
        for n in points:
            if round_ < max(1, reps) - (n in known):
                out[n].append(passes.run(chains[n]))
    return out
