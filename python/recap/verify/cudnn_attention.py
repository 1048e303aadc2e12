"""Verification passes on CUDA keep PyTorch's cuDNN attention out.

A tree pass hands the model an attention mask, which FlashAttention does not take, so in half
precision on a Hopper GPU PyTorch's `scaled_dot_product_attention` picks the cuDNN kernel. That
kernel builds an execution graph for every new shape of query and key (hundreds of microseconds
to milliseconds of host time per layer), and every decoding step has a new shape: the context
grows by what was accepted, and the tree's size changes. On an H200 with a random-weight model
of Qwen2.5-VL-7B's shapes in bfloat16 (torch 2.11), that made a one-node step cost 81 ms of
forward against `generate`'s 32 ms per token; cuDNN's attention was 61% of the host time of a
pass (benches/gpu_check.py, docs/results/gpu.md).

So while any thread runs a verification pass on CUDA, the cuDNN backend is switched off and
PyTorch takes its memory-efficient kernel, which takes a mask and builds nothing. The switch
is process-wide in PyTorch (`torch.backends.cuda.enable_cudnn_sdp`), so it is counted: the
first pass to enter turns it off, the last to leave restores what the process had. A user's
own attention call on another thread while a pass runs gets the efficient kernel too (the same
result up to rounding). The prefill is left alone, so it runs the kernel `generate` runs.
Float32 never took cuDNN's kernel (it has none), so float32 results do not change.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_lock = threading.Lock()
_depth = 0  # verification passes on CUDA now running, all threads together
_saved = True  # the process's own setting, restored when the last pass leaves


@contextlib.contextmanager
def without_cudnn_attention(device: torch.device) -> Iterator[None]:
    """Inside, PyTorch's attention does not use cuDNN (a no-op off CUDA)."""
    if device.type != "cuda":
        yield
        return
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = torch.backends.cuda.cudnn_sdp_enabled()
            torch.backends.cuda.enable_cudnn_sdp(False)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                torch.backends.cuda.enable_cudnn_sdp(_saved)
