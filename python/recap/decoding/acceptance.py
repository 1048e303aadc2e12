"""Each tree node's own pick under sampling and logits processors, computed on the device
before the step's one download, so that Rust's `accept_path` is the only walk of the tree
for greedy and sampled decoding alike.

A node at depth d stands for output position t + d, after the history (prompt + committed
tokens) and the node's path. The nodes are grouped by depth; at each depth the processors
run once over all of that depth's nodes (one row per node, its path ids built from a
device copy of the history and the tree's path table), then the pick is the argmax or the
inverse CDF of the counter-based uniform of (seed, t + d) (`recap.decoding.sampling`). The picks
replace the raw argmax in the packed array; acceptance then follows exactly the picks
one-token decoding would have made at each position.

Only live nodes matter (a node whose parent is live and whose token is its parent's pick):
on a CPU, where reading a pick costs nothing, each depth processes only its live nodes
(usually one); on an accelerator every node of a depth is processed, so no step waits on
the device before the download.
"""

from __future__ import annotations

import numpy as np
import torch

from recap.decoding.sampling import TokenChooser, pick_rows, uniform


class NodePicks:
    """One request's device-side picks (see the module doc)."""

    def __init__(self, chooser: TokenChooser, prompt: list[int], capacity: int, max_nodes: int,
                 device: torch.device) -> None:
        self.chooser, self.device = chooser, device
        self.sync_free = device.type == "cpu"
        # The history (prompt + committed tokens) lives on the device, written as tokens commit.
        self.history = torch.zeros(max(capacity, len(prompt)), dtype=torch.long, device=device)
        self.history[: len(prompt)] = torch.as_tensor(prompt, dtype=torch.long)
        self.length = len(prompt)
        t = max_nodes + 1
        self._paths = np.zeros((t, t), dtype=np.int64)  # row i: node i's path tokens below the root

    def commit(self, tokens: list[int]) -> None:
        n = len(tokens)
        if self.length + n > self.history.shape[0]:
            grown = self.history.new_zeros(2 * (self.length + n))
            grown[: self.length] = self.history[: self.length]
            self.history = grown
        self.history[self.length:self.length + n] = torch.as_tensor(tokens, dtype=torch.long).to(self.device)
        self.length += n

    def _path_table(self, tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray, deepest: int) -> None:
        paths = self._paths
        for d in range(1, deepest + 1):
            nodes = np.flatnonzero(depths == d)
            if d > 1:
                paths[nodes, : d - 1] = paths[parents[nodes], : d - 1]
            paths[nodes, d - 1] = tokens[nodes]

    def _process(self, logits: torch.Tensor, nodes: np.ndarray, d: int, t: int) -> torch.Tensor:
        index = torch.from_numpy(nodes).to(self.device, non_blocking=True)
        scores = logits.index_select(0, index)
        processors = self.chooser.processors
        if processors is not None:
            hist = self.history[: self.length].expand(len(nodes), self.length)
            if d:
                path = torch.from_numpy(self._paths[nodes, :d]).to(self.device, non_blocking=True)
                hist = torch.cat([hist, path], dim=1)
            scores = processors(hist, scores)
        seed = self.chooser.seed
        return pick_rows(scores, self.chooser.do_sample, uniform(seed, t + d) if seed is not None else 0.0)

    def pick(self, logits: torch.Tensor, tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray,
             deepest: int, t: int) -> torch.Tensor:
        """Every (live) node's pick [T] on the device; `t` is the root's output position."""
        n = logits.shape[0]
        self._path_table(tokens, parents, depths, deepest)
        # Acceptance reads a node's pick only when the node is accepted, and accepted nodes are
        # live: the others keep a placeholder (on an accelerator every node is picked anyway).
        picks = torch.zeros(n, dtype=torch.long, device=logits.device)
        if self.sync_free:
            live = np.zeros(n, dtype=bool)
            live[0] = True
            host = picks.numpy()
            for d in range(deepest + 1):
                nodes = np.flatnonzero(live & (depths == d))
                if nodes.size == 0:
                    break
                host[nodes] = self._process(logits, nodes, d, t).numpy()
                if d < deepest:
                    below = np.flatnonzero(depths == d + 1)
                    par = parents[below]
                    live[below] = live[par] & (tokens[below] == host[par])
            return picks
        for d in range(deepest + 1):
            nodes = np.flatnonzero(depths == d)
            picks.index_copy_(0, torch.from_numpy(nodes).to(self.device), self._process(logits, nodes, d, t))
        return picks
