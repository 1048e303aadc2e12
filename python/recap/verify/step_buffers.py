"""What the steps of one request write into, allocated once per request.

The drafter writes each tree into host arrays (tokens, parents, depths and the T x T
additive mask block, `Drafter.propose_into`); the additive attention mask [1, 1, T, context]
lives in one device buffer of which each step writes only the tree block and zeroes only the
columns that became committed prefix since the last step.
"""

from __future__ import annotations

import numpy as np
import torch


def masked_value(dtype: torch.dtype) -> float:
    """The additive mask's "cannot attend" value: the dtype's most negative finite number
    (float32's for wider types, so the host block in float32 holds it exactly)."""
    return float(max(torch.finfo(dtype).min, torch.finfo(torch.float32).min))


class StepBuffers:
    """Every call here is a few operations: right after a forward pass on a CPU the host's
    caches are cold, and each torch or numpy call then costs 10-25 us, so views are made once
    per tree size and the drafter writes positions and the deepest depth itself."""

    def __init__(self, max_nodes: int, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        t = max_nodes + 1
        # On CUDA the host side is pinned, so the step's uploads are asynchronous: the only
        # synchronisation of a step is the download of the packed top-k (which also orders the
        # next step's writes into these buffers after this step's uploads).
        pin = device.type == "cuda"
        self.device = device
        self.tokens_t = torch.zeros(t, dtype=torch.int64, pin_memory=pin)
        self.depths_t = torch.zeros(t, dtype=torch.int64, pin_memory=pin)
        self.positions_t = torch.zeros(t, dtype=torch.int64, pin_memory=pin)
        self.block_t = torch.zeros(t * t, dtype=torch.float32, pin_memory=pin)
        self.tokens, self.depths, self.block = self.tokens_t.numpy(), self.depths_t.numpy(), self.block_t.numpy()
        self.positions = self.positions_t.numpy()
        self.parents = np.zeros(t, dtype=np.int64)
        self.masked = masked_value(dtype)
        self.mask = torch.zeros(1, 1, t, max(capacity, t), dtype=dtype, device=device)
        self._mask2d = self.mask[0, 0]
        self._dirty = (0, 0)  # columns [lo, hi) may hold an earlier tree's block
        self._views: dict[int, tuple] = {}

    def draft(self, drafter, position_base: int) -> tuple[int, int]:
        """The drafter's next tree into the buffers, position ids `position_base` + depth;
        returns (T, the deepest node's depth)."""
        return drafter.propose_into(self.tokens, self.parents, self.depths, self.positions, self.block,
                                    self.masked, position_base)

    def _host_views(self, n: int) -> tuple:
        v = self._views.get(n)
        if v is None:
            v = self._views[n] = (self.tokens_t[:n].unsqueeze(0), self.depths_t[:n],
                                  self.positions_t[:n].unsqueeze(0), self.block_t[: n * n].view(n, n))
        return v

    def upload(self, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The tree's tokens [1, n], depths [n] and position ids [1, n] on the device (on a
        CPU: views of the buffers, no copy)."""
        tokens, depths, positions, _ = self._host_views(n)
        if self.device.type != "cpu":
            tokens, depths, positions = (x.to(self.device, non_blocking=True) for x in (tokens, depths, positions))
        return tokens, depths, positions

    def full_mask(self, n: int, past: int) -> torch.Tensor:
        """[1, 1, n, past + n]: every node sees the committed prefix, and within the tree its
        ancestors and itself (a view of the buffer)."""
        if past + n > self.mask.shape[-1]:
            cap = self.mask.shape[-1]
            while cap < past + n:
                cap *= 2
            self.mask = self.mask.new_zeros((*self.mask.shape[:-1], cap))
            self._mask2d = self.mask[0, 0]
            self._dirty = (0, 0)
        lo, hi = self._dirty
        if lo < min(hi, past):
            self._mask2d[:, lo:min(hi, past)].zero_()
        self._mask2d[:n, past:past + n].copy_(self._host_views(n)[3], non_blocking=True)
        self._dirty = (past, max(hi, past + n))
        return self.mask[:, :, :n, :past + n]
