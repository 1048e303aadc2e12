"""The KV cache of one decoding request, laid out for tree verification.

transformers' `DynamicCache` concatenates every layer's keys and values on every pass (a
copy of the whole cache per step) and can only drop entries from the end. Here every
layer's keys live in one preallocated buffer, [layers, batch, heads, capacity, head_dim]
(values alike), shaped by the first layer written:

- a pass writes its new entries in place (no concatenation);
- dropping the rejected part of a tree moves a length per layer (no tensor work);
- keeping an accepted branch that is not a prefix of the packed tree is one gather and one
  write for all layers together (per layer only where layers differ in length, as under
  visual-token routing, or in shape).

The buffer grows by doubling when a request outlives its capacity. Layers are plain
`DynamicLayer`s to the model: `keys` / `values` are views of the filled part.

A batch (`recap.verify.tree_pass`) keeps its rows in the batch dimension, ragged: every layer holds
the same length W (the longest row's), and a row's columns past its own length are holes
the mask hides. Its row edits live here, with the storage they edit: `move_entries` (each
row's accepted nodes to their place, one gather and one write for every row and layer),
`keep_rows` (finished rows leave, the kept ones move down in place) and `append_row` (a row
that joins between steps).
"""

from __future__ import annotations

import numpy as np
import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

DEFAULT_CAPACITY = 512  # tokens, when the caller does not know the request's length


class _Slab:
    """Storage shared by the layers of one cache; a layer shaped unlike the first one written
    gets a buffer of its own."""

    def __init__(self, n_layers: int, capacity: int) -> None:
        self.n_layers, self.capacity = max(n_layers, 1), max(capacity, 1)
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.layers: list[SlabLayer] = []
        # Per layer index: entries held, written yet, in the shared buffer. One array, so a
        # crop is one operation, not one per layer.
        self.lengths = np.zeros(self.n_layers, dtype=np.int64)
        self.attached = np.zeros(self.n_layers, dtype=bool)
        self.all_shared = True

    def _index(self, i: int) -> None:
        if i >= len(self.lengths):  # more layers than announced: room for them
            extra = i + 1 - len(self.lengths)
            self.lengths = np.concatenate([self.lengths, np.zeros(extra, dtype=np.int64)])
            self.attached = np.concatenate([self.attached, np.zeros(extra, dtype=bool)])

    def attach(self, layer: SlabLayer, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.keys is None:
            self.keys = k.new_empty((self.n_layers, *k.shape[:-2], self.capacity, k.shape[-1]))
            self.values = v.new_empty((self.n_layers, *v.shape[:-2], self.capacity, v.shape[-1]))
        assert self.keys is not None and self.values is not None
        fits = (layer.index < self.n_layers and k.dtype == self.keys.dtype and k.device == self.keys.device
                and k.shape[:-2] == self.keys.shape[1:-2] and k.shape[-1] == self.keys.shape[-1]
                and v.shape[:-2] == self.values.shape[1:-2] and v.shape[-1] == self.values.shape[-1])
        if fits:
            layer.own_keys = layer.own_values = None
        else:
            layer.own_keys = k.new_empty((*k.shape[:-2], self.capacity, k.shape[-1]))
            layer.own_values = v.new_empty((*v.shape[:-2], self.capacity, v.shape[-1]))
            self.all_shared = False
        self._index(layer.index)
        self.attached[layer.index] = True
        self.layers.append(layer)

    def grow(self, needed: int) -> None:
        """At least `needed` entries per layer, by doubling; every layer's views follow."""
        cap = self.capacity
        while cap < needed:
            cap *= 2

        def bigger(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            out = t.new_empty((*t.shape[:-2], cap, t.shape[-1]))
            out[..., : self.capacity, :].copy_(t)
            return out

        self.keys, self.values = bigger(self.keys), bigger(self.values)
        for layer in self.layers:
            layer.own_keys, layer.own_values = bigger(layer.own_keys), bigger(layer.own_values)
        self.capacity = cap


class SlabLayer(DynamicLayer):
    """One attention layer's entries: a view of the shared buffer (or of its own)."""

    def __init__(self, slab: _Slab, index: int) -> None:
        # Not DynamicLayer.__init__: `keys` and `values` are read-only views of the buffer.
        self.is_initialized = False
        self.slab, self.index = slab, index
        slab._index(index)
        self.own_keys: torch.Tensor | None = None
        self.own_values: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.is_initialized = True
        self.slab.attach(self, key_states, value_states)

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.own_keys is not None and self.own_values is not None:
            return self.own_keys, self.own_values
        assert self.slab.keys is not None and self.slab.values is not None, "buffers before the first write"
        return self.slab.keys[self.index], self.slab.values[self.index]

    @property
    def shared(self) -> bool:
        return self.is_initialized and self.own_keys is None

    @property
    def length(self) -> int:
        return int(self.slab.lengths[self.index])

    @length.setter
    def length(self, value: int) -> None:
        self.slab.lengths[self.index] = value

    @property  # a view of the slab, not a stored tensor
    def keys(self) -> torch.Tensor | None:  # type: ignore[override]
        return self.buffers()[0][..., : self.length, :] if self.is_initialized else None

    @property
    def values(self) -> torch.Tensor | None:  # type: ignore[override]
        return self.buffers()[1][..., : self.length, :] if self.is_initialized else None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = int(self.slab.lengths[self.index])
        end = start + key_states.shape[-2]
        if end > self.slab.capacity:
            self.slab.grow(end)
        k, v = self.buffers()
        k[..., start:end, :].copy_(key_states)
        v[..., start:end, :].copy_(value_states)
        self.slab.lengths[self.index] = end
        return k[..., :end, :], v[..., :end, :]

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop: expected a negative number of entries to drop, got {tokens_to_remove}")
        if self.is_initialized:
            self.length = max(self.length + tokens_to_remove, 0)

    def reset(self) -> None:
        self.length = 0

    def _unsupported(self, *_args, **_kwargs):
        raise NotImplementedError("recap's tree-verification cache edits its rows itself (SlabCache.keep_rows, "
                                  "append_row); transformers' beam and batch edits are not supported")

    batch_repeat_interleave = batch_select_indices = reorder_cache = _unsupported


class SlabCache(DynamicCache):
    """A `DynamicCache` whose layers share one preallocated buffer (see the module doc)."""

    def __init__(self, n_layers: int, capacity: int = DEFAULT_CAPACITY, *, index_slots: int = 0,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.slab = _Slab(n_layers, capacity)
        # The compaction's source indices, in one host buffer allocated once (pinned where
        # the cache lives on an accelerator, so the upload does not wait for the device; the
        # step's download has completed the previous upload before the next write).
        pin = device is not None and torch.device(device).type == "cuda"
        self._index = torch.zeros(max(index_slots, 1), dtype=torch.int64, pin_memory=pin)
        self.layer_class_to_replicate = lambda: SlabLayer(self.slab, len(self.layers))  # type: ignore[assignment]

    def nbytes(self) -> int:
        """Bytes of every buffer the cache holds."""
        slab = self.slab
        shared = [t for t in (slab.keys, slab.values) if t is not None]
        own = [t for layer in slab.layers for t in (layer.own_keys, layer.own_values) if t is not None]
        return sum(t.untyped_storage().nbytes() for t in shared + own)

    def crop(self, tokens_to_remove: int) -> None:
        """Drops the last `-tokens_to_remove` entries of every layer (one array operation)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop: expected a negative number of entries to drop, got {tokens_to_remove}")
        if tokens_to_remove:
            slab = self.slab
            slab.lengths[slab.attached] = np.maximum(slab.lengths[slab.attached] + tokens_to_remove, 0)

    def keep(self, path: np.ndarray, tree_len: int) -> None:
        """Of the last `tree_len` entries of every layer (the tree just verified, root first),
        keep the root and the accepted nodes `path` (tree indices, increasing, 0 first)."""
        accepted = len(path)
        if int(path[-1]) != accepted - 1:  # not a prefix of the packed tree: move entries
            slab = self.slab
            held = slab.lengths[slab.attached]
            if slab.all_shared and held.size and held.min() == held.max() and slab.keys is not None \
                    and slab.values is not None:
                self._move(slab.keys, slab.values, int(held[0]) - tree_len, path)  # every layer alike: one gather
            else:
                for layer in self.layers:
                    if isinstance(layer, SlabLayer) and layer.is_initialized and layer.length > 0:
                        k, v = layer.buffers()
                        self._move(k, v, layer.length - tree_len, path)
        self.crop(-(tree_len - accepted))

    def _move(self, keys: torch.Tensor, values: torch.Tensor, base: int, path: np.ndarray) -> None:
        """Entries base + path[1:] move to base + 1, base + 2, ... (each source is at or after
        its destination, and gathered before the write)."""
        m = len(path) - 1
        if self._index.shape[0] < m:
            self._index = torch.zeros(m, dtype=torch.int64, pin_memory=self._index.is_pinned())
        host = self._index[:m]
        np.add(path[1:], base, out=host.numpy())
        idx = host if keys.device.type == "cpu" else host.to(keys.device, non_blocking=True)
        dst = slice(base + 1, base + len(path))
        keys[..., dst, :] = keys.index_select(-2, idx)
        values[..., dst, :] = values.index_select(-2, idx)

    # ---- the rows of a batch -----------------------------------------------------------------
    def _buffers(self):
        """(keys, values, the batch dimension) for every buffer of the slab."""
        slab = self.slab
        if slab.keys is not None and slab.values is not None:
            yield slab.keys, slab.values, 1
        for layer in slab.layers:
            if layer.own_keys is not None and layer.own_values is not None:
                yield layer.own_keys, layer.own_values, 0

    def set_length(self, length: int) -> None:
        """Every written layer holds `length` entries (a batch's common width)."""
        slab = self.slab
        slab.lengths[slab.attached] = length

    def move_entries(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Entry src[i] of row rows[i] moves to dst[i], in every layer (all sources are read
        before any write)."""
        for keys, values, bdim in self._buffers():
            for buf in (keys, values):
                if bdim == 1:
                    buf[:, rows, :, dst] = buf[:, rows, :, src]
                else:
                    buf[rows, :, dst] = buf[rows, :, src]

    def keep_rows(self, keep: list[int], width: int) -> None:
        """Only the rows `keep` (increasing indices, at least one) stay. Kept rows move down in
        place over the used `width` only, and the buffers become views of their first rows:
        no allocation, and a copy of at most the rows after the first dropped one."""
        n = len(keep)
        for keys, values, bdim in self._buffers():
            for buf in (keys, values):
                for j, b in enumerate(keep):
                    if j != b:
                        if bdim == 1:
                            buf[:, j, ..., :width, :] = buf[:, b, ..., :width, :]
                        else:
                            buf[j, ..., :width, :] = buf[b, ..., :width, :]
        slab = self.slab
        if slab.keys is not None and slab.values is not None:
            slab.keys, slab.values = slab.keys[:, :n], slab.values[:, :n]
        for layer in slab.layers:
            if layer.own_keys is not None and layer.own_values is not None:
                layer.own_keys, layer.own_values = layer.own_keys[:n], layer.own_values[:n]

    def append_row(self, row: SlabCache, width: int, room: int) -> None:
        """`row` (a one-row cache of n entries per layer) becomes a new last row: its entries at
        columns [0, n), the other rows' used `width` kept, at least n + `room` columns. The
        slab is reallocated with one more row; columns that are holes hold zeros, never
        uninitialised memory (a masked key still enters the score product, and a NaN there
        would reach every query)."""
        layers = [layer for layer in row.layers if isinstance(layer, SlabLayer)]
        slab = self.slab
        if slab.keys is None:  # the first row: the slab takes its shapes
            for i, layer in enumerate(layers):
                assert layer.keys is not None and layer.values is not None
                self.update(layer.keys, layer.values, i)
            return
        n = layers[0].length
        rows = slab.keys.shape[1]
        cap = max(slab.capacity, n + room)

        def wider(buf: torch.Tensor, bdim: int) -> torch.Tensor:
            shape = list(buf.shape)
            shape[bdim], shape[-2] = rows + 1, cap
            out = buf.new_zeros(shape)
            if bdim == 1:
                out[:, :rows, ..., :width, :] = buf[..., :width, :]
            else:
                out[:rows, ..., :width, :] = buf[..., :width, :]
            return out

        assert slab.values is not None
        slab.keys, slab.values = wider(slab.keys, 1), wider(slab.values, 1)
        for layer in slab.layers:
            if layer.own_keys is not None and layer.own_values is not None:
                layer.own_keys, layer.own_values = wider(layer.own_keys, 0), wider(layer.own_values, 0)
        slab.capacity = cap
        for layer in slab.layers:
            keys, values = layer.buffers()
            new = layers[layer.index]
            assert new.keys is not None and new.values is not None
            keys[rows, ..., :n, :] = new.keys[0]
            values[rows, ..., :n, :] = new.values[0]
