"""The conformance probe: on first use of a model, one small draft tree is verified in a
single pass (`recap.verify.tree_pass.TreePass`, the pass decoding runs) and compared with the
model's own causal forward over each of the tree's paths (one plain forward over both, the
model's own mask and positions; one per path where the model takes no batch), and the
cache is compacted to a side branch and decoded one more token. A model that ignores the
tree mask, the explicit positions or the compaction is refused with the reason, instead of
decoding wrong text.

The tree pass and the last one-token pass are timed (`ModelState.probe_passes`): the
pass decoding runs, in the model's own layout, so a first use that defers the layout choice
takes them as its cost curve's points. A pass is kept with the model and across processes
(`recap.state.measurements`, keyed by the model's fingerprint and class, dtype, device, attention
implementation and the torch, transformers and recap versions), so a later process on the
same model skips the probe's four passes.

Tree (preorder):  r -> a -> b -> c   and   r -> d -> e;  after the pass, keep r, d, e and
decode f. When the model has a short sliding window, the context is longer than the window,
so the window's edge is crossed inside the tree.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from recap._core import __version__
from recap.adapters.base import ModelAdapter
from recap.adapters.capability import UnsupportedModelError
from recap.state import measurements
from recap.state.model_state import state_of
from recap.verify.tree_pass import TreePass

PARENTS = [-1, 0, 1, 2, 0, 4]
DEPTHS = [0, 1, 2, 3, 1, 2]
CHAIN = 4  # r, a, b, c: the first nodes of the preorder form one path
KEEP = np.array([0, 4, 5])  # r, d, e
# Logit tolerance relative to the largest logit, by dtype: a tree pass rounds differently
# from one-token passes (other matrix shapes), more so in reduced precision; some float64
# models still take a float32 softmax (Gemma 2), hence 1e-6 there.
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3, torch.bfloat16: 6e-2, torch.float16: 2e-2}


def _tokens(adapter: ModelAdapter, n: int) -> list[int]:
    gen = torch.Generator().manual_seed(1234)
    bad = set(adapter.excluded)
    out: list[int] = []
    while len(out) < n:
        t = int(torch.randint(3, max(adapter.vocab_size - 1, 4), (1,), generator=gen))
        if t not in bad:
            out.append(t)
    return out


def _causal(adapter: ModelAdapter, context: list[int], tails: list[list[int]], device) -> list[torch.Tensor]:
    """Logits after each token of every tail (all of one length) following `context`: the
    model's own forward (its causal mask and positions, no cache), all tails as one batch;
    one row at a time where the model takes no batch (`recap.catchup` routes one sequence)."""
    def run(rows: list[list[int]]) -> torch.Tensor:
        adapter.before_prefill()
        out = adapter.model(input_ids=torch.tensor([context + t for t in rows], device=device), use_cache=False)
        return out.logits[:, len(context):].double()

    try:
        return list(run(tails))
    except Exception:  # noqa: BLE001 - a wrapper that refuses batches: the same forward, row by row
        return [run([t])[0] for t in tails]


def _tree_pass(tp: TreePass, tokens: list[int], shift: int = 0) -> torch.Tensor:
    n, deepest = tp.load_tree(tokens, PARENTS)
    tp.positions[0, :n] += shift
    return tp.verify(n, deepest).double()


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    tol = TOLERANCE.get(dtype, 1e-3) * max(1.0, float(b.abs().max()))
    if float((a - b).abs().max()) > tol:
        return False
    # Argmax must agree unless the reference's top two are within the tolerance (a near tie).
    top2 = b.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > tol
    return bool((a.argmax(-1) == b.argmax(-1))[clear].all())


@torch.no_grad()
def probe(adapter: ModelAdapter) -> bool:
    """Raises `UnsupportedModelError` naming what failed; passes once per model and dtype.
    Returns whether it ran the model (False when a pass was already known)."""
    model = adapter.model
    key = (adapter.dtype, str(adapter.lm_head.weight.device))
    state = state_of(model)
    if state.conformance == key:
        return False
    cls = type(model)  # the fingerprint names the architecture, not a subclass's own forward
    stored_as = measurements.key(model, "conformance", (f"{cls.__module__}.{cls.__qualname__}", __version__,
                                                         getattr(model.config, "_attn_implementation", None)))
    if measurements.load(stored_as) is True:  # passed in an earlier process
        state.conformance = key
        return False
    device = adapter.lm_head.weight.device
    window = adapter.sliding_window
    n_ctx = window + 2 if window is not None and window <= 48 else 8
    toks = _tokens(adapter, n_ctx + 7)
    context, tree, f = toks[:n_ctx], toks[n_ctx:n_ctx + 6], toks[-1]
    name = type(model).__name__
    path_a = [tree[i] for i in (0, 1, 2, 3)]
    path_d = [tree[i] for i in (0, 4, 5)] + [f]
    along_a, along_d = _causal(adapter, context, [path_a, path_d], device)  # r, a, b, c and r, d, e, f
    want = torch.cat([along_a, along_d[1:3]])  # preorder
    want_f = along_d[3:]
    adapter.before_prefill()
    tp = TreePass(adapter, max_nodes=len(tree), capacity=n_ctx + 2 * len(tree))
    try:
        tp.prefill(torch.tensor([context], device=device), None, {})
        t = time.perf_counter()
        got = _tree_pass(tp, tree)
        passes = {len(tree): time.perf_counter() - t}
    except Exception as e:  # noqa: BLE001 - any failure here means the model cannot take a tree pass
        raise UnsupportedModelError(
            f"{name}: a draft-tree verification pass (4D additive mask, explicit position ids) failed: "
            f"{type(e).__name__}: {e}") from e
    dt = adapter.dtype
    if not _close(got, want, dt):
        tp.discard(len(tree))
        shifted = _tree_pass(tp, tree, shift=7)
        if torch.equal(shifted, got):
            raise UnsupportedModelError(
                f"{name} ignores explicit position ids: a tree pass gave the same logits at shifted positions")
        if _close(got[:CHAIN], want[:CHAIN], dt):
            raise UnsupportedModelError(
                f"{name} ignores the 4D tree attention mask: nodes on a side branch saw the other branch "
                "(their logits differ from one-token decoding while the first path's match)")
        diff = float((got - want).abs().max())
        raise UnsupportedModelError(
            f"{name}: a draft-tree pass does not reproduce one-token decoding (max logit difference {diff:.3g} "
            f"in {dt}); its attention may not honour a 4D additive mask")
    try:
        tp.compact([KEEP], len(tree))
        t = time.perf_counter()
        got_f = tp.verify(*tp.load_chain([f])).double()
        passes[1] = time.perf_counter() - t
    except Exception as e:  # noqa: BLE001
        raise UnsupportedModelError(
            f"{name}: its KV cache cannot be compacted to the accepted path (crop and gather): "
            f"{type(e).__name__}: {e}") from e
    if not _close(got_f, want_f, dt):
        raise UnsupportedModelError(
            f"{name}: after compacting its KV cache to the accepted path, decoding differs from one-token "
            "decoding (the cache is not croppable per token)")
    state.conformance = key
    state.probe_passes = passes
    measurements.store(stored_as, True)
    return True
