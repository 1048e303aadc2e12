"""Grouped-query attention without copying the cache, in verification passes on a CPU.

A pass of several tokens hands the model an attention mask (the tree's), and for a masked
query of more than one token transformers' `sdpa` attention repeats every key and value
head once per query head it serves (`repeat_kv`) before calling PyTorch's attention: a copy
of the whole cache, in every layer, on every pass. SmolLM2-135M (9 query heads, 3 key/value
heads, 30 layers) with 823 tokens of context writes 114 MB per pass that way. A one-token
step never pays it (transformers folds that query's heads instead), so the copy made every
tree dearer than a step by a cost that grows with the context.

PyTorch's own attention takes the grouping directly (`enable_gqa=True`, torch >= 2.5);
transformers only asks for it where no mask is given, because on CUDA a mask with it falls
back to the slow math kernel. On a CPU the fused kernel takes the mask and the grouping
together and gives the same bits as the repeated copy (tests/test_grouped_attention.py), in
1.5-1.8x less time at 100-2,000 tokens of context.

So while a thread runs a verification pass of several tokens (`grouped(tokens)`),
transformers' choice (`sdpa_attention.use_gqa_in_sdpa`) answers yes for CPU tensors on that
thread; every other call, and every other thread, gets transformers' own answer. A pass of
one token keeps transformers' folded query (its bits are `generate`'s; the grouped kernel's
differ in float32's last bits there). Nothing changes where the
function is not found (another transformers version) or torch is older than 2.5.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_local = threading.local()
_installed: bool | None = None  # whether the wrapper is in place; None: not tried yet
_lock = threading.Lock()


def _torch_groups() -> bool:
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    return (major, minor) >= (2, 5)


def _install() -> bool:
    """Wraps transformers' `use_gqa_in_sdpa`, tried once per process (every pass asks);
    False where it cannot."""
    global _installed
    if _installed is not None:
        return _installed
    with _lock:
        if _installed is None:
            _installed = _wrap()
        return _installed


def _wrap() -> bool:
    try:
        from transformers.integrations import sdpa_attention
    except ImportError:
        return False
    original = getattr(sdpa_attention, "use_gqa_in_sdpa", None)
    if original is None or not _torch_groups():
        return False

    def use_gqa_in_sdpa(attention_mask, key, *args, **kwargs):
        if getattr(_local, "depth", 0) and key.device.type == "cpu":
            value = args[0] if args else kwargs.get("value", key)
            if key.shape[-1] == value.shape[-1]:
                return True
        return original(attention_mask, key, *args, **kwargs)

    use_gqa_in_sdpa.__wrapped__ = original  # type: ignore[attr-defined]
    sdpa_attention.use_gqa_in_sdpa = use_gqa_in_sdpa
    return True


@contextlib.contextmanager
def grouped(tokens: int) -> Iterator[bool]:
    """A context for a pass of `tokens` query tokens per row in which this thread's masked
    `sdpa` attention on the CPU groups query heads over the cache's key/value heads instead
    of copying them (for more than one token); yields whether it does."""
    if tokens < 2:
        yield False
        return
    ok = _install()
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield ok
    finally:
        _local.depth -= 1
