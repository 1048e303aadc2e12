"""The lean step's pieces: the slab KV cache, the tree pass's masks, and the one-call boundary
with the drafter (propose_into / observe_packed)."""

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import recap
import torch
from recap import Drafter
from recap.verify.kv_cache import SlabCache
from recap.verify.tree_pass import TreePass, masked_value
from transformers import DynamicCache

V = 50


def _fill(cache, steps, layers=3, heads=2, dim=4, gen=None):
    """Writes `steps` chunks of random entries through the cache's update, as a model would."""
    gen = gen or torch.Generator().manual_seed(0)
    for n in steps:
        for layer in range(layers):
            k = torch.randn(1, heads, n, dim, generator=gen, dtype=torch.float64)
            cache.update(k, k * 2 + 1, layer)


@pytest.mark.parametrize("capacity", [1, 7, 64])
def test_slab_cache_matches_dynamic_cache_through_growth_crop_and_gather(capacity):
    """Same entries as transformers' DynamicCache after appends past the capacity, crops,
    and keeping a non-prefix path of a tree (one gather for all layers)."""
    slab, ref = SlabCache(3, capacity), DynamicCache()
    for c in (slab, ref):
        _fill(c, [5, 3, 9])
    path = np.array([0, 2, 5, 6])
    slab.keep(path, 9)
    for layer in ref.layers:  # the reference: gather the kept entries, then crop
        base = layer.keys.shape[-2] - 9
        idx = torch.as_tensor(base + path)
        layer.keys = torch.cat([layer.keys[..., :base, :], layer.keys[..., idx, :]], dim=-2)
        layer.values = torch.cat([layer.values[..., :base, :], layer.values[..., idx, :]], dim=-2)
    slab.crop(-1)
    ref.crop(-1)
    for c in (slab, ref):
        _fill(c, [2], gen=torch.Generator().manual_seed(1))
    assert slab.get_seq_length() == ref.get_seq_length() == 5 + 3 + 4 - 1 + 2
    for a, b in zip(slab.layers, ref.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_slab_cache_keeps_layers_of_different_lengths_apart():
    """Visual-token routing leaves deeper layers with shorter prefixes: each layer then keeps
    its own last tree entries."""
    slab = SlabCache(2, 16)
    gen = torch.Generator().manual_seed(0)
    short = torch.randn(1, 1, 3, 2, generator=gen, dtype=torch.float64)
    long = torch.randn(1, 1, 6, 2, generator=gen, dtype=torch.float64)
    slab.update(long, long, 0)
    slab.update(short, short, 1)
    tree = torch.arange(8, dtype=torch.float64).reshape(1, 1, 4, 2)
    slab.update(tree, tree, 0)
    slab.update(tree, tree, 1)
    slab.keep(np.array([0, 3]), 4)
    for layer, prefix in zip(slab.layers, (long, short), strict=True):
        want = torch.cat([prefix, tree[..., [0, 3], :]], dim=-2)
        assert torch.equal(layer.keys, want) and torch.equal(layer.values, want)


def test_slab_cache_gives_a_differently_shaped_layer_its_own_buffer():
    slab = SlabCache(2, 4)
    a = torch.ones(1, 2, 3, 4)
    b = torch.ones(1, 1, 3, 8)
    slab.update(a, a, 0)
    slab.update(b, b, 1)
    assert slab.layers[0].shared and not slab.layers[1].shared
    slab.update(b, b, 1)  # past the capacity: grows
    assert slab.layers[1].keys.shape == (1, 1, 6, 8) and slab.layers[0].keys.shape == (1, 2, 3, 4)


def test_each_rows_mask_sees_its_own_prefix_and_tree_and_a_window_hides_what_lies_outside_it():
    from tiny_models import text_model

    adapter = recap.Decoder(text_model("Llama")).adapter
    tp = TreePass(adapter, max_nodes=4, capacity=16, rows=2)
    neg = masked_value(torch.float32)
    # Row 0: 2 padding columns, committed up to 6; row 1: committed up to 9 (the width).
    tp.pad[:], tp.past[:], tp.width = [2, 0], [6, 9], 9
    rng = np.random.default_rng(0)
    t = 3
    blocks = [np.where(np.tril(rng.random((t, t)) < 0.5) | np.eye(t, dtype=bool), 0.0, neg) for _ in range(2)]
    depths = torch.tensor([[0, 1, 2], [0, 1, 1]])
    got = tp.masks(torch.from_numpy(np.stack(blocks).astype(np.float32)), depths, t)
    assert got.shape == (2, 1, t, 9 + t)
    for b, (pad, past) in enumerate(((2, 6), (0, 9))):
        want = np.full((t, 9 + t), neg, dtype=np.float32)
        want[:, pad:past] = 0.0
        want[:, 9:] = blocks[b]
        assert np.array_equal(got[b, 0].numpy(), want), b
    # A window of 4: key column c of row b (real index c - pad) is out for a node at real
    # index past - pad + depth once c - pad <= that index - 4.
    tp.window = 4
    tp.adapter = copy.copy(adapter)  # a model whose layers all slide
    tp.adapter.mask_types = ["sliding_attention"]
    sliding = tp.masks(torch.from_numpy(np.stack(blocks).astype(np.float32)), depths, t)
    for b, (pad, past) in enumerate(((2, 6), (0, 9))):
        for i in range(t):
            node = past - pad + int(depths[b, i])
            for c in range(pad, past):
                assert (sliding[b, 0, i, c] == neg) == (c - pad <= node - 4), (b, i, c)


def _sliding_reference(pad, past, width, depths, block, window, neg):
    """Row b's sliding-window mask [T, W + T] from scratch (see `TreePass._slid`)."""
    t = len(depths)
    want = np.full((t, width + t), neg, dtype=np.float32)
    for i, d in enumerate(depths):
        node = past - pad + d
        for c in range(pad, past):
            if c - pad > node - window:
                want[i, c] = 0.0
        for j, dk in enumerate(depths):
            if block[i, j] == 0.0 and not dk <= d - window:
                want[i, width + j] = 0.0
    return want


@pytest.mark.parametrize("rows", [1, 2])
def test_the_sliding_window_mask_kept_across_steps_equals_one_written_from_scratch(rows):
    """The sliding-window mask is a buffer a step only partly rewrites: over steps of
    growing, ragged rows and trees of every size (deeper than the window too), it equals the
    mask written whole for each step, and while no key has left any window it is the full
    mask itself."""
    from tiny_models import text_model

    adapter = copy.copy(recap.Decoder(text_model("Llama")).adapter)
    adapter.mask_types = ["full_attention", "sliding_attention"]
    tp = TreePass(adapter, max_nodes=7, capacity=8, rows=rows)
    tp.window = window = 6
    neg = masked_value(torch.float32)
    rng = np.random.default_rng(1)
    pads = [0] if rows == 1 else [2, 0]
    tp.pad[:] = pads
    tp.past[:] = [p + 1 for p in pads]
    tp.width = int(tp.past.max())
    seen_shared = seen_own = False
    for _step in range(40):
        sizes = rng.integers(1, 9, size=rows) if _step else np.ones(rows, dtype=np.int64)
        t = int(sizes.max())
        # Chains (as deep as the tree allows) and bushes in turn: a node's depth changes from
        # step to step in both directions.
        chain = 0.9 if _step % 2 else 0.1
        parents = [[-1] + [i - 1 if rng.random() < chain else int(rng.integers(0, i)) for i in range(1, n)]
                   for n in sizes]
        trees = []
        for b in range(rows):
            n = int(sizes[b])
            depth = np.zeros(t, dtype=np.int64)
            seen = np.eye(t, dtype=bool)
            for i in range(1, n):
                depth[i] = depth[parents[b][i]] + 1
                seen[i, : n] |= seen[parents[b][i], : n]
            trees.append((np.where(seen, 0.0, neg).astype(np.float32), depth))
        if rows == 1:
            tp.load_tree(np.arange(int(sizes[0])) + 3, parents[0])
            masks = tp.upload()[2]
        else:
            block = torch.from_numpy(np.stack([b for b, _ in trees]))
            masks = tp.masks(block, torch.from_numpy(np.stack([d for _, d in trees])), t)
        full, sliding = masks["full_attention"], masks["sliding_attention"]
        shared = sliding.data_ptr() == full.data_ptr()
        seen_shared |= shared
        seen_own |= not shared
        for b in range(rows):
            n = int(sizes[b]) if rows == 1 else t
            block, depth = trees[b]
            want = _sliding_reference(int(tp.pad[b]), int(tp.past[b]), tp.width, depth[:n], block[:n, :n], window,
                                      neg)
            assert np.array_equal(sliding[b, 0].numpy(), want), (_step, b)
        # Each row commits 1..size tokens; the cache's width becomes the longest row's.
        tp.past += [int(rng.integers(1, int(n) + 1)) for n in sizes]
        tp.width = int(tp.past.max())
        tp._grow_columns(tp.width)
    assert seen_shared and seen_own


def test_a_row_alone_keeps_its_path_and_a_batch_moves_each_rows_nodes():
    from tiny_models import text_model

    adapter = recap.Decoder(text_model("Llama")).adapter
    gen = torch.Generator().manual_seed(0)
    for rows in (1, 2):
        tp = TreePass(adapter, max_nodes=4, capacity=32, rows=rows)
        ids = torch.randint(3, 100, (rows, 5), generator=gen)
        tp.prefill(ids, torch.ones_like(ids), {})
        tp.load_tree([7, 8, 9, 10], [-1, 0, 0, 2])  # row 0; every other row drafts the same tree
        for name in ("tokens", "parents", "depths", "positions", "blocks", "sizes"):
            getattr(tp, name)[1:] = getattr(tp, name)[0]
        tokens, positions, mask, t = tp.upload()
        tp.forward(tokens, positions, mask)
        layer = tp.cache.layers[0]
        tree_keys = layer.keys[:, :, 5:9].clone()  # the tree's entries after the prompts
        tp.compact([np.array([0, 2, 3])] * rows, t)  # root, then the second branch
        assert tp.past.tolist() == [8] * rows and tp.width == 8
        kept = tp.cache.layers[0].keys
        assert kept.shape[-2] == 8
        assert torch.equal(kept[:, :, 5:8], tree_keys[:, :, [0, 2, 3]])


def test_propose_into_and_observe_packed_match_propose_and_observe():
    history = np.array([3, 5, 7, 3, 5, 9, 3, 5, 7, 11, 3, 5], dtype=np.int64)
    rng = np.random.default_rng(0)
    ids = np.argsort(-rng.random((len(history), V)), axis=1)[:, :8].astype(np.int64)
    probs = np.sort(rng.random((len(history), 8)).astype(np.float32), axis=1)[:, ::-1].copy()
    a, b = Drafter.recap(V, budget=12).session(), Drafter.recap(V, budget=12).session()
    for d in (a, b):
        d.begin(history)
        d.seed(ids, probs)
    t = a.max_nodes + 1
    names = ("tokens", "parents", "depths", "positions")
    bufs = SimpleNamespace(**{name: np.zeros(t, dtype=np.int64) for name in names},
                           block=np.zeros(t * t, dtype=np.float32))
    for _ in range(5):
        tree = a.propose()
        n, deepest = b.propose_into(bufs.tokens, bufs.parents, bufs.depths, bufs.positions, bufs.block,
                                    masked_value(torch.float32), 100)
        assert n == len(tree) and deepest == tree.depths.max()
        assert bufs.positions[:n].tolist() == (tree.depths + 100).tolist()
        assert bufs.tokens[:n].tolist() == tree.tokens.tolist()
        assert bufs.parents[:n].tolist() == tree.parents.tolist()
        assert bufs.depths[:n].tolist() == tree.depths.tolist()
        want = np.where(tree.mask, 0.0, masked_value(torch.float32)).ravel()
        assert np.array_equal(bufs.block[: n * n], want)
        pred = np.where(rng.random(n) < 0.7, np.roll(tree.tokens, -1), rng.integers(0, V, n)).astype(np.int64)
        top_ids = np.argsort(-rng.random((n, V)), axis=1)[:, :8].astype(np.int64)
        top_p = np.sort(rng.random((n, 8)).astype(np.float32), axis=1)[:, ::-1].copy()
        packed = np.concatenate([pred[:, None], top_ids, top_p], axis=1).astype(np.float32)
        pa, ca = a.observe(pred, top_ids, top_p)
        pb, cb = b.observe_packed(packed, 8)
        assert pa.tolist() == pb.tolist() and ca.tolist() == cb.tolist()


def test_the_step_boundary_rejects_bad_buffers_and_packed_arrays():
    d = Drafter.recap(V, budget=12).session()
    d.begin(np.array([1, 2, 3, 1, 2], dtype=np.int64))
    small = np.zeros(1, dtype=np.int64)
    d.propose()
    with pytest.raises(ValueError, match="block: expected a buffer of at least"):
        d.propose_into(*(np.zeros(64, np.int64) for _ in range(4)), np.zeros(0, np.float32), -1.0)
    with pytest.raises(TypeError):
        d.propose_into(small.astype(np.float32), small, small, small, np.zeros(4, np.float32), -1.0)
    n, _ = d.propose_into(*(np.zeros(64, np.int64) for _ in range(4)), np.zeros(64 * 64, np.float32), -1.0)
    with pytest.raises(ValueError, match="expected 17 columns"):
        d.observe_packed(np.zeros((n, 5), np.float32), 8)
    bad = np.zeros((n, 17), np.float32)
    bad[0, 0] = 1.5
    with pytest.raises(ValueError, match="whole numbers"):
        d.observe_packed(bad, 8)
    with pytest.raises(TypeError, match="2-D float32 or float64"):
        d.observe_packed(np.zeros((n, 17), np.int64), 8)
