"""``budget="auto"`` for a batch: one tree width for all rows, spent where it pays.

A batched pass verifies every row's tree padded to the step's width T (tokens per row, root
included), so its cost depends on B x T, not on how the nodes spread over rows. Each row's
session ranks its drafted nodes best-first (Rust, `Session.propose_ranked`: the cumulative
expected accepted nodes g_b(m) of its best m nodes, from the same calibrated acceptance
table a single request uses), and the controller picks the width with the most expected
committed tokens per second over the batch:

    T* = argmax_T  sum_b (1 + g_b(T - 1)) / c_B(T)

A row deep in a verbatim copy has a steep g and earns a wide step for the batch; rows on
open text add little, and when no width beats T = 1 the batch drafts nothing (one token per
row and pass, as batched greedy decoding).

c_B(T) starts from the decoder's measured cost curve at B x T total tokens (linear beyond its
last point) and is corrected online by the ratio of each step's measured pass time to that
prior, per batch size and width (interpolated between the widths observed at that batch
size, and the nearest one's beyond them).
"""

from __future__ import annotations

import threading

import numpy as np

from recap.budget import CostModel

SMOOTHING = 0.2  # weight of a new observation in the online ratio


class BatchBudget:
    """The decoder's batch cost model and width controller (shared by its requests)."""

    def __init__(self, cost: CostModel, max_width: int) -> None:
        self.points = np.asarray(cost.points, dtype=np.float64)
        self.seconds = np.asarray(cost.seconds, dtype=np.float64)
        self.max_width = max_width
        self._ratios: dict[int, dict[int, float]] = {}  # batch size -> width -> measured / prior
        self._lock = threading.Lock()
        self.last_width = 1

    def prior(self, tokens: np.ndarray) -> np.ndarray:
        """The measured curve at `tokens` total tokens per pass (linear beyond its last point)."""
        p, s = self.points, self.seconds
        out = np.interp(tokens, p, s)
        if len(p) >= 2:
            slope = max((s[-1] - s[-2]) / (p[-1] - p[-2]), 0.0)
            out = np.where(tokens > p[-1], s[-1] + slope * (tokens - p[-1]), out)
        return out

    def costs(self, rows: int) -> np.ndarray:
        """c_B(T) for T = 1 .. max_width."""
        widths = np.arange(1, self.max_width + 1)
        cost = self.prior(rows * widths.astype(np.float64))
        seen = self._ratios.get(rows)
        if seen:
            known = np.array(sorted(seen))
            ratios = np.array([seen[w] for w in known])
            cost = cost * np.interp(widths, known, ratios)  # constant beyond the observed widths
        return cost

    def width(self, gains: list[np.ndarray]) -> int:
        """The step's width T from each row's ranked gains (see the module doc)."""
        rows, top = len(gains), self.max_width
        table = np.zeros((rows, top), dtype=np.float64)
        for b, g in enumerate(gains):
            m = min(len(g), top)
            table[b, :m] = g[:m]
            table[b, m:] = g[m - 1] if m else 0.0
        expected = rows + table.sum(axis=0)  # index T - 1: every row keeps T - 1 nodes
        rate = expected / self.costs(rows)
        self.last_width = int(rate.argmax()) + 1
        return self.last_width

    def observe(self, rows: int, width: int, seconds: float) -> None:
        """A pass over `rows` rows of `width` tokens took `seconds`."""
        prior = float(self.prior(np.array([rows * width], dtype=np.float64))[0])
        if not (seconds > 0 and prior > 0):
            return
        r = seconds / prior
        with self._lock:
            seen = self._ratios.setdefault(rows, {})
            old = seen.get(width)
            seen[width] = r if old is None else (1 - SMOOTHING) * old + SMOOTHING * r
