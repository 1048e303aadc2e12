"""Local Transition Correction: moves a re-admitted token's stale hidden state along the
transition its anchors made while it was deferred."""

from __future__ import annotations

import torch


def transition_correct(stale: torch.Tensor, anchors_then: torch.Tensor, anchors_now: torch.Tensor,
                       distances: torch.Tensor, *, m: int, lam: float, gamma: float, tau: float) -> torch.Tensor:
    """Corrected states of re-admitted tokens.

    stale [R, d]: each token's state when it was deferred (layer l_p); anchors_then [A, d]
    and anchors_now [A, d]: the anchors' states at l_p and now (layer l); distances [R, A]:
    normalised patch-grid distances. An anchor's score is cos(stale, then) - lam * distance;
    the top ``m`` are softmax(score / tau) weighted, and the token moves by gamma times their
    weighted displacement. With no anchors the stale state is returned unchanged.
    """
    if anchors_then.shape[0] == 0 or stale.shape[0] == 0 or gamma == 0.0:
        return stale
    f = torch.float32 if stale.dtype in (torch.float16, torch.bfloat16) else stale.dtype
    s, then, now = stale.to(f), anchors_then.to(f), anchors_now.to(f)
    cos = torch.nn.functional.normalize(s, dim=-1) @ torch.nn.functional.normalize(then, dim=-1).T
    score = cos - lam * distances.to(f)
    top = min(m, then.shape[0])
    best, idx = score.topk(top, dim=-1)  # [R, top]
    w = torch.softmax(best / tau, dim=-1)
    delta = (now - then)[idx]  # [R, top, d]
    return (s + gamma * (w.unsqueeze(-1) * delta).sum(1)).to(stale.dtype)


def grid_distances(coords: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, norm: float) -> torch.Tensor:
    """Euclidean distances [len(rows), len(cols)] between visual tokens on their patch grid,
    divided by `norm`. coords [N, 3] holds (image, row, col); tokens of different images are
    1e3 apart, so an anchor from another image never outranks one from the same image."""
    a, b = coords[rows].to(torch.float32), coords[cols].to(torch.float32)
    d = torch.cdist(a[:, 1:], b[:, 1:])
    other = a[:, :1] != b[:, :1].T
    return torch.where(other, torch.full_like(d, 1e3), d / norm)
