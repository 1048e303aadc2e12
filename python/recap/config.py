"""The knobs of the RECAP drafter, validated in one place (the Rust core validates again)."""

from __future__ import annotations

from dataclasses import dataclass, field

from recap._core import Drafter, PersistentMemory

FUSION_MODES = ("unigram", "backoff", "uniform", "prior", "prior_confidence")
DEFAULT_ETA = (0.68, 0.63, 0.50, 0.43, 0.40, 0.38)
AUTO = "auto"
#: Longest suffix chain with ``suffix_len="auto"`` (min(16, 1 + 4 * match length)).
AUTO_SUFFIX_CAP = 16
#: Suffix chain length with ``suffix_len="auto"`` and a fixed budget (the method's setting).
FIXED_BUDGET_SUFFIX = 4


@dataclass(frozen=True)
class RecapConfig:
    """RECAP settings. The method's defaults (K = 8, depth 10, its eta and priors), plus:

    - ``budget``: tree nodes verified per step (root not counted). ``"auto"`` (default) builds
      up to ``max_budget`` nodes and verifies the prefix with the most expected committed
      tokens per second on this model and hardware (see `recap.budget`); an int verifies
      exactly that many (the method's published setting is 63).
    - ``suffix_len``: suffix continuation tokens grafted from the root. ``"auto"`` (default):
      with ``budget="auto"`` the chain follows the match length, min(16, 1 + 4 * match
      length), and the budget logic weighs its nodes by their own observed acceptance; with a
      fixed budget it is the method's 4. An int is always that many.
    """

    k: int = 8
    budget: int | str = AUTO
    max_budget: int = 63
    max_depth: int = 10
    eta: tuple[float, ...] = DEFAULT_ETA
    priors: tuple[float, float, float] = (0.70, 0.20, 0.10)
    fusion: str = "prior_confidence"
    suffix_len: int | str = AUTO
    context_capacity: int = 8192
    seed_context: bool = False
    reset_memory: bool = False
    memory_capacity: int = 49_152
    excluded: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        def need(cond: bool, name: str, expected: str, got: object) -> None:
            if not cond:
                raise ValueError(f"{name}: expected {expected}, got {got!r}")

        for name in ("k", "budget", "max_budget", "max_depth", "suffix_len", "context_capacity",
                     "memory_capacity"):
            v = getattr(self, name)
            auto_ok = name in ("budget", "suffix_len") and v == AUTO
            need(auto_ok or (isinstance(v, int) and not isinstance(v, bool)), name,
                 'an int or "auto"' if name in ("budget", "suffix_len") else "an int", v)
        need(1 <= self.k <= 64, "k", "1 <= k <= 64", self.k)
        need(self.auto_budget or 0 <= self.budget <= 4096, "budget", '0 <= budget <= 4096 or "auto"',
             self.budget)
        need(0 <= self.max_budget <= 4096, "max_budget", "0 <= max_budget <= 4096", self.max_budget)
        need(1 <= self.max_depth <= 256, "max_depth", "1 <= max_depth <= 256", self.max_depth)
        need(self.suffix_len == AUTO or 0 <= self.suffix_len <= 256, "suffix_len",
             '0 <= suffix_len <= 256 or "auto"', self.suffix_len)
        need(self.fusion in FUSION_MODES, "fusion", f"one of {FUSION_MODES}", self.fusion)
        need(len(self.eta) > 0 and all(0 < e <= 1 for e in self.eta), "eta", "values in (0, 1]", self.eta)
        need(len(self.priors) == 3 and all(p >= 0 for p in self.priors) and sum(self.priors) > 0,
             "priors", "three values >= 0 with a positive sum", self.priors)
        need(self.memory_capacity >= 1, "memory_capacity", ">= 1", self.memory_capacity)
        need(self.context_capacity >= 1, "context_capacity", ">= 1", self.context_capacity)

    @property
    def auto_budget(self) -> bool:
        return self.budget == AUTO

    @property
    def adaptive_suffix(self) -> bool:
        return self.suffix_len == AUTO and self.auto_budget

    @property
    def suffix_tokens(self) -> int:
        """Suffix chain length (the cap, when adaptive)."""
        if self.suffix_len != AUTO:
            return int(self.suffix_len)
        return AUTO_SUFFIX_CAP if self.auto_budget else FIXED_BUDGET_SUFFIX

    @property
    def tree_budget(self) -> int:
        """Nodes the tree search builds: `budget`, or `max_budget` when the budget is automatic."""
        return self.max_budget if self.budget == AUTO else int(self.budget)

    def new_memory(self, vocab_size: int) -> PersistentMemory:
        return PersistentMemory(vocab_size, k=self.k, capacity=self.memory_capacity)

    def new_drafter(self, vocab_size: int, memory: PersistentMemory | None = None,
                    excluded: tuple[int, ...] = ()) -> Drafter:
        """A RECAP drafter for one request stream, sharing `memory` when given."""
        return Drafter.recap(
            vocab_size,
            k=self.k,
            budget=self.tree_budget,
            max_depth=self.max_depth,
            eta=list(self.eta),
            priors=tuple(self.priors),
            fusion=self.fusion,
            suffix_len=self.suffix_tokens,
            suffix_adaptive=self.adaptive_suffix,
            context_capacity=self.context_capacity,
            seed_context=self.seed_context,
            reset_memory=self.reset_memory,
            excluded=sorted(set(self.excluded) | set(excluded)),
            memory=memory if memory is not None else self.new_memory(vocab_size),
        )
