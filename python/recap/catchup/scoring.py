"""Relevance of every visual token at a routing layer: the head-averaged attention the last
text token would pay it, computed with the layer's own norm, projections and RoPE at the
tokens' original positions. One query row: O(heads x N) memory, never N x N."""

from __future__ import annotations

import torch

from recap.adapters.base import AttentionParts


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def last_token_attention(parts: AttentionParts, states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         last: int) -> torch.Tensor:
    """Head-mean post-softmax attention [last + 1] of token `last` over tokens 0..last.

    parts: the layer's attention parts (`ModelAdapter.attention_parts`); states [N, d]: the
    layer's input (deferred tokens: their cached state); cos, sin [N, hd]: the rotary tables
    at the original positions."""
    hd = parts.head_dim
    x = parts.norm(states[: last + 1])
    q = parts.query(x[last:]).view(1, -1, hd)
    k = parts.key(x).view(last + 1, -1, hd)
    if parts.q_norm is not None:
        q = parts.q_norm(q)
    if parts.k_norm is not None:
        k = parts.k_norm(k)
    c, s = cos[: last + 1].unsqueeze(1), sin[: last + 1].unsqueeze(1)
    q = q * c[last:] + _rotate_half(q) * s[last:]
    k = k * c + _rotate_half(k) * s
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # grouped-query heads
    logits = torch.einsum("qhd,nhd->hn", q, k) * parts.scaling
    return torch.softmax(logits, dim=-1, dtype=torch.float32).mean(0)
