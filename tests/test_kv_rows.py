"""The row edits of a batch's KV slab (`recap.verify.kv_cache.SlabCache`): moving accepted entries,
dropping rows and appending one, checked entry by entry against plain tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from recap.verify.kv_cache import SlabCache

LAYERS, HEADS, DIM = 3, 2, 4


def filled(rows: int, length: int, seed: int, capacity: int = 32) -> tuple[SlabCache, list[torch.Tensor]]:
    """A slab of `rows` rows holding `length` random entries per layer; also each layer's keys."""
    g = torch.Generator().manual_seed(seed)
    cache = SlabCache(LAYERS, capacity)
    keys = []
    for i in range(LAYERS):
        k = torch.randn(rows, HEADS, length, DIM, generator=g, dtype=torch.float64)
        cache.update(k, -k, i)
        keys.append(k)
    return cache, keys


def held(cache: SlabCache, layer: int) -> torch.Tensor:
    k = cache.layers[layer].keys
    assert k is not None and torch.equal(cache.layers[layer].values, -k)
    return k


def test_move_entries_gathers_every_source_before_writing():
    cache, keys = filled(2, 10, 0)
    rows, src, dst = torch.tensor([0, 0, 1]), torch.tensor([7, 9, 4]), torch.tensor([6, 7, 4])
    cache.move_entries(rows, src, dst)
    for i in range(LAYERS):
        want = keys[i].clone()
        want[0, :, 6], want[0, :, 7] = keys[i][0, :, 7], keys[i][0, :, 9]  # 7 read before it is overwritten
        assert torch.equal(held(cache, i), want)


@pytest.mark.parametrize("keep", [[1, 2], [0, 2], [2], [0, 1, 2]])
def test_keep_rows_moves_the_kept_rows_down_without_touching_their_entries(keep):
    cache, keys = filled(3, 8, 1)
    cache.keep_rows(keep, 8)
    for i in range(LAYERS):
        assert torch.equal(held(cache, i), keys[i][keep])


def test_append_row_keeps_the_rows_and_zeroes_the_new_holes():
    cache, keys = filled(2, 6, 2, capacity=8)
    row, row_keys = filled(1, 11, 3, capacity=11)
    cache.append_row(row, width=6, room=5)
    assert cache.slab.capacity >= 16  # the longer row and room for a tree
    cache.set_length(11)
    for i in range(LAYERS):
        k = held(cache, i)
        assert k.shape == (3, HEADS, 11, DIM)
        assert torch.equal(k[:2, :, :6], keys[i]) and torch.equal(k[2], row_keys[i][0])
        assert not k[:2, :, 6:].any()  # holes of the shorter rows: zeros, not stale memory
    # The first row of an empty slab: the slab takes its shapes.
    empty = SlabCache(LAYERS, 16)
    empty.append_row(row, width=0, room=5)
    for i in range(LAYERS):
        assert torch.equal(held(empty, i), row_keys[i])


def test_rows_dropped_then_appended_keep_each_rows_entries():
    cache, keys = filled(3, 5, 4)
    cache.keep_rows([0, 2], 5)
    row, row_keys = filled(1, 3, 5)
    cache.append_row(row, width=5, room=4)
    cache.set_length(5)
    for i in range(LAYERS):
        k = held(cache, i)
        assert torch.equal(k[:2], keys[i][[0, 2]])
        assert torch.equal(k[2, :, :3], row_keys[i][0]) and not k[2, :, 3:].any()
    assert np.all(cache.slab.lengths[cache.slab.attached] == 5)
