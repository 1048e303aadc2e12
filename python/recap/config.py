"""The knobs of the RECAP drafter, validated in one place (the Rust core validates again)."""

from __future__ import annotations

from dataclasses import dataclass, field

from recap._core import Drafter, PersistentMemory

FUSION_MODES = ("unigram", "backoff", "uniform", "prior", "prior_confidence")
DEFAULT_ETA = (0.68, 0.63, 0.50, 0.43, 0.40, 0.38)


@dataclass(frozen=True)
class RecapConfig:
    """RECAP settings; defaults are the method's (K = 8, 63 nodes, depth 10, 4 suffix tokens)."""

    k: int = 8
    budget: int = 63
    max_depth: int = 10
    eta: tuple[float, ...] = DEFAULT_ETA
    priors: tuple[float, float, float] = (0.70, 0.20, 0.10)
    fusion: str = "prior_confidence"
    suffix_len: int = 4
    context_capacity: int = 8192
    seed_context: bool = False
    reset_memory: bool = False
    memory_capacity: int = 49_152
    excluded: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        def need(cond: bool, name: str, expected: str, got: object) -> None:
            if not cond:
                raise ValueError(f"{name}: expected {expected}, got {got!r}")

        for name in ("k", "budget", "max_depth", "suffix_len", "context_capacity", "memory_capacity"):
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool), name, "an int", v)
        need(1 <= self.k <= 64, "k", "1 <= k <= 64", self.k)
        need(0 <= self.budget <= 4096, "budget", "0 <= budget <= 4096", self.budget)
        need(1 <= self.max_depth <= 256, "max_depth", "1 <= max_depth <= 256", self.max_depth)
        need(0 <= self.suffix_len <= 256, "suffix_len", "0 <= suffix_len <= 256", self.suffix_len)
        need(self.fusion in FUSION_MODES, "fusion", f"one of {FUSION_MODES}", self.fusion)
        need(len(self.eta) > 0 and all(0 < e <= 1 for e in self.eta), "eta", "values in (0, 1]", self.eta)
        need(len(self.priors) == 3 and all(p >= 0 for p in self.priors) and sum(self.priors) > 0,
             "priors", "three values >= 0 with a positive sum", self.priors)
        need(self.memory_capacity >= 1, "memory_capacity", ">= 1", self.memory_capacity)
        need(self.context_capacity >= 1, "context_capacity", ">= 1", self.context_capacity)

    def new_memory(self, vocab_size: int) -> PersistentMemory:
        return PersistentMemory(vocab_size, k=self.k, capacity=self.memory_capacity)

    def new_drafter(self, vocab_size: int, memory: PersistentMemory | None = None,
                    excluded: tuple[int, ...] = ()) -> Drafter:
        """A RECAP drafter for one request stream, sharing `memory` when given."""
        return Drafter.recap(
            vocab_size,
            k=self.k,
            budget=self.budget,
            max_depth=self.max_depth,
            eta=list(self.eta),
            priors=tuple(self.priors),
            fusion=self.fusion,
            suffix_len=self.suffix_len,
            context_capacity=self.context_capacity,
            seed_context=self.seed_context,
            reset_memory=self.reset_memory,
            excluded=sorted(set(self.excluded) | set(excluded)),
            memory=memory if memory is not None else self.new_memory(vocab_size),
        )
