"""The verification cost curve c(n) behind ``budget="auto"``.

c(n) is the time of one verification pass over n tree tokens (root included), top-k and the
device-to-host copy included, exactly as a decoding step runs it. It is measured once per
model, device, dtype and thread count (a few dozen forward passes, cached for the process),
and refined online from the timings of real steps, since the true cost also grows with the
context length. The Rust side turns c(n) and its calibrated acceptance probabilities into
the tree size of each step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from recap.model_state import state_of

POINTS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
CALIBRATION_PAST = 128  # context tokens in the cache while measuring
EMA = 0.1


MIN_OBSERVATIONS = 3  # passes near a point before its own correction replaces the global one


@dataclass
class CostModel:
    """Measured pass times at `points` tokens, with online correction factors: one per point
    once real passes of about that size were seen, a global one for the other points (the
    cost drifts with the context length for every size alike)."""

    points: list[int]
    seconds: list[float]
    ratio: list[float] = field(default_factory=list)
    seen: list[int] = field(default_factory=list)
    global_ratio: float = 1.0
    observed_steps: int = 0

    def __post_init__(self) -> None:
        if not self.ratio:
            self.ratio = [1.0] * len(self.points)
        if not self.seen:
            self.seen = [0] * len(self.points)

    def curve(self, max_tokens: int) -> list[float]:
        """c(1), ..., c(max_tokens) in seconds, interpolated (extrapolated past the last point)."""
        xs = np.asarray(self.points, dtype=np.float64)
        ratio = [r if k >= MIN_OBSERVATIONS else self.global_ratio for r, k in zip(self.ratio, self.seen, strict=True)]
        ys = _monotone(np.asarray(self.seconds, dtype=np.float64) * np.asarray(ratio))
        n = np.arange(1, max_tokens + 1, dtype=np.float64)
        out = np.interp(n, xs, ys)
        if len(xs) >= 2:
            slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
            beyond = n > xs[-1]
            out[beyond] = ys[-1] + slope * (n[beyond] - xs[-1])
        return out.tolist()

    def observe(self, tokens: int, seconds: float) -> None:
        """Moves the correction factor of the nearest measured point toward an observed pass."""
        i = int(np.argmin([abs(p - tokens) for p in self.points]))
        base = float(np.interp(tokens, self.points, self.seconds))
        if base > 0:
            r = seconds / base
            if self.seen[i] == 0:
                self.ratio[i] = self.global_ratio
            self.ratio[i] += EMA * (r - self.ratio[i])
            self.global_ratio += EMA * (r - self.global_ratio)
            self.seen[i] += 1
        self.observed_steps += 1

    def as_dict(self) -> dict:
        return {"points": list(self.points), "ms": [s * 1e3 for s in self.seconds],
                "online_ratio": list(self.ratio), "global_ratio": self.global_ratio,
                "observed_steps": self.observed_steps}


def _monotone(y: np.ndarray) -> np.ndarray:
    """Non-decreasing in n: each value becomes the least of itself and every larger pass.
    Timing noise only ever adds time, so an outlier is pulled down to what a bigger pass
    took, and the points after it keep their values."""
    return np.minimum.accumulate(np.asarray(y, dtype=np.float64)[::-1])[::-1]



def model_key(model: torch.nn.Module) -> tuple:
    """What a timing on `model` depends on besides the model itself: device, dtype, threads."""
    p = next(model.parameters())
    return (str(p.device), str(p.dtype), torch.get_num_threads())


def cost_model(model: torch.nn.Module, verify, max_tokens: int, *, variant: tuple = (),
               refresh: bool = False, reps: int = 3) -> CostModel:
    """The cached cost model of `model` (measured now if missing, or if `refresh`).

    `verify(cache, past, tokens)` runs one verification pass of a [1, n] chain of tokens the
    way the decoder does; `new_cache()` comes with it as `verify.new_cache`, and the token
    ids never to feed (image placeholders) as `verify.excluded`. `variant` names anything
    else the passes depend on (the linear layout they run in)."""
    per_model = state_of(model).cost_curves  # with the model: it goes when the model goes
    key = model_key(model) + tuple(variant)
    found = per_model.get(key)
    if found is not None and not refresh and found.points[-1] >= min(max_tokens, POINTS[-1]):
        return found
    points = [p for p in POINTS if p < max_tokens] + [max_tokens]
    points = sorted(set(points))
    seconds = _measure(model, verify, points, reps)
    per_model[key] = CostModel(points, seconds)
    return per_model[key]


class ChainPasses:
    """Verification passes over random chains after a fixed random context of
    CALIBRATION_PAST tokens, run exactly as decoding steps run them (`verify`)."""

    def __init__(self, model: torch.nn.Module, verify) -> None:
        self.model, self.verify = model, verify
        self.device = next(model.parameters()).device
        self.vocab = model.get_output_embeddings().weight.shape[0]
        self.gen = torch.Generator().manual_seed(0)
        self.excluded = torch.tensor(sorted(getattr(verify, "excluded", ())), dtype=torch.long)
        self.cache = verify.new_cache()
        with torch.no_grad():
            model(input_ids=self.draw(CALIBRATION_PAST), **{verify.cache_kw: self.cache}, use_cache=True,
                  logits_to_keep=1)

    def draw(self, n: int) -> torch.Tensor:
        # Random text tokens; never an image placeholder (it would read as an image prompt).
        t = torch.randint(3, max(self.vocab - 1, 4), (1, n), generator=self.gen)
        return t.masked_fill(torch.isin(t, self.excluded), 3).to(self.device)

    @torch.no_grad()
    def run(self, tokens: torch.Tensor) -> float:
        """Seconds of one pass over `tokens` (the cache is left as it was)."""
        t = time.perf_counter()
        self.verify(self.cache, CALIBRATION_PAST, tokens)
        dt = time.perf_counter() - t
        self.cache.crop(-tokens.shape[1])
        return dt


def _measure(model, verify, points: list[int], reps: int) -> list[float]:
    passes = ChainPasses(model, verify)
    out = []
    for n in points:
        tokens = passes.draw(n)
        times = [passes.run(tokens) for _ in range(reps + 1)]  # the first pass of each size warms up
        out.append(float(np.median(times[1:])))
    return _monotone(np.asarray(out)).tolist()
