"""Choosing each committed token: greedy or sampled, with the logits processors transformers
builds from a `GenerationConfig` (temperature, top-k/p, min-p, typical, epsilon/eta,
repetition and n-gram penalties, bad words, suppression, minimum lengths, a user's own list).

Acceptance for drafts without draft probabilities (every drafter here): every node's logits
are processed with its own history (prompt + committed tokens + the node's path) and give
the node's pick (`recap.decoding.acceptance`, on the device); from the root, a child carrying its
parent's pick is accepted, and the deepest accepted node commits its own pick (Rust's
`accept_path`, the same walk as greedy decoding). Each committed token is thereby picked from exactly the
distribution one-token-at-a-time generation would have used at that position, given the same
preceding tokens: the tree only decides how many of those picks one pass can serve (see
README, "Sampling").

Reproducible by seed: the token at output position t is drawn by inverse CDF (token-id
order) from a uniform that depends only on (seed, t), a counter-based generator (splitmix64
of seed and t). Any drafter at any budget therefore commits the same tokens as one-token
sampling (`drafter="ar"`) with the same seed.
"""

from __future__ import annotations

import torch

_M = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M
    return x ^ (x >> 31)


def uniform(seed: int, t: int) -> float:
    """A uniform in [0, 1) that depends only on (seed, t)."""
    return (_splitmix64(_splitmix64(seed & _M) ^ (t & _M)) >> 11) * 2.0**-53


def pick_rows(scores: torch.Tensor, do_sample: bool, u: float) -> torch.Tensor:
    """Per row of processed `scores` [m, V]: the argmax, or the token whose cumulative
    probability (token-id order) first exceeds `u` (never a zero-probability token)."""
    if not do_sample:
        return scores.argmax(dim=-1)
    probs = torch.softmax(scores.double(), dim=-1)
    cdf = torch.cumsum(probs, dim=-1)
    idx = torch.searchsorted(cdf, cdf[:, -1:] * u, right=True).clamp_max_(probs.shape[-1] - 1)
    # Rounding at the very top of the CDF can land on a zero-probability token: step back to
    # the last token with probability > 0 at or before it. (Checked first on a CPU, where
    # reading costs nothing; an accelerator always takes the branch-free form.)
    if probs.device.type == "cpu" and bool((probs.gather(1, idx) > 0).all()):
        return idx.squeeze(1)
    ids = torch.arange(probs.shape[-1], device=probs.device)
    last_nonzero = torch.where(probs > 0, ids, -1).cummax(dim=-1).values
    return last_nonzero.gather(1, idx).clamp_min_(0).squeeze(1)


def inverse_cdf(scores: torch.Tensor, u: float) -> int:
    """The token whose cumulative probability (token-id order) first exceeds u; tokens with
    probability 0 are never picked."""
    return int(pick_rows(scores.unsqueeze(0), True, u)[0])


class TokenChooser:
    """Picks the token after a history from that position's logits."""

    def __init__(self, processors=None, do_sample: bool = False, seed: int | None = None) -> None:
        self.processors = processors if processors is not None and len(processors) > 0 else None
        self.do_sample = do_sample
        if do_sample and seed is None:  # drawn from torch's generator, so torch.manual_seed repeats a run
            seed = int(torch.randint(0, 2**62, (1,)))
        self.seed = seed

    @property
    def plain_greedy(self) -> bool:
        """The argmax of the raw logits: the Rust acceptance walks the tree on its own."""
        return not self.do_sample and self.processors is None

    def choose(self, history: list[int], logits: torch.Tensor, t: int) -> int:
        scores = logits.unsqueeze(0)
        if self.processors is not None:
            ids = torch.tensor([history], dtype=torch.long, device=logits.device)
            scores = self.processors(ids, scores)
        u = uniform(self.seed, t) if self.do_sample and self.seed is not None else 0.0
        return int(pick_rows(scores, self.do_sample, u)[0])
