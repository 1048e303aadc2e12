"""The knobs of the RECAP drafter. Their defaults, limits and validation live once, in the
Rust core (`recap._core.recap_defaults`, `recap._core.check_recap_config`); this dataclass
adds only what is Python's: the ``"auto"`` choices and the type checks."""

from __future__ import annotations

from dataclasses import dataclass, field

from recap._core import Drafter, PersistentMemory, check_recap_config, recap_defaults

_D = recap_defaults()
FUSION_MODES = tuple(_D["fusion_modes"])
DEFAULT_ETA = tuple(_D["eta"])
AUTO = "auto"
#: Longest suffix chain with ``suffix_len="auto"`` and an automatic budget.
AUTO_SUFFIX_CAP = _D["auto_suffix_cap"]
#: Suffix chain length with ``suffix_len="auto"`` and a fixed budget (the method's setting).
FIXED_BUDGET_SUFFIX = _D["suffix_len"]


@dataclass(frozen=True)
class RecapConfig:
    """RECAP settings. The method's defaults (K = 8, depth 10, its eta and priors), plus:

    - ``budget``: tree nodes verified per step (root not counted). ``"auto"`` (default) builds
      up to ``max_budget`` nodes and verifies the prefix with the most expected committed
      tokens per second on this model and hardware (see `recap.first_use.budget`); an int verifies
      exactly that many (the method's published setting is 63).
    - ``suffix_len``: suffix continuation tokens grafted from the root. ``"auto"`` (default):
      with ``budget="auto"`` the chain follows the match length, min(cap, 1 + 4 * match
      length), and the budget logic weighs its nodes by their own observed acceptance; with a
      fixed budget it is the method's 4. An int is always that many.
    - ``frequency``: with ``budget="auto"``, also merge the tree a frequency-counted suffix
      tree over the request proposes (SuffixDecoding's) into every draft; the budget prices
      those nodes by their own observed acceptance, so a small tree holds what that tree
      would pick and a large one adds what the memories know. False: the method as
      published (drafter ``recap_paper``).
    - ``frequency_floor``: with ``frequency``, whenever the budget drafts, the frequency
      tree's own proposal (what suffix decoding would verify) is added to the calibrated
      choice where it pays as a whole; a paused request drafts none of it (drafter
      ``recap_floor``). Off by default: on a 2-core CPU it raised tau (1.62 against 1.53 on
      three open-text prompts) but not the speed (docs/results/fastest.md).
    """

    k: int = _D["k"]
    budget: int | str = AUTO
    max_budget: int = _D["max_budget"]
    max_depth: int = _D["max_depth"]
    eta: tuple[float, ...] = DEFAULT_ETA
    priors: tuple[float, float, float] = tuple(_D["priors"])
    fusion: str = _D["fusion"]
    suffix_len: int | str = AUTO
    context_capacity: int = _D["context_capacity"]
    seed_context: bool = False
    reset_memory: bool = False
    frequency: bool = True
    frequency_floor: bool = False
    memory_capacity: int = _D["memory_capacity"]
    excluded: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("k", "budget", "max_budget", "max_depth", "suffix_len", "context_capacity",
                     "memory_capacity"):
            v = getattr(self, name)
            auto_ok = name in ("budget", "suffix_len") and v == AUTO
            if not (auto_ok or (isinstance(v, int) and not isinstance(v, bool))):
                expected = 'an int or "auto"' if name in ("budget", "suffix_len") else "an int"
                raise ValueError(f"{name}: expected {expected}, got {v!r}")
        for name in ("seed_context", "reset_memory", "frequency", "frequency_floor"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected a bool, got {getattr(self, name)!r}")
        if not isinstance(self.fusion, str):
            raise ValueError(f"fusion: expected one of {FUSION_MODES}, got {self.fusion!r}")
        try:
            eta, priors = [float(e) for e in self.eta], tuple(float(p) for p in self.priors)
        except (TypeError, ValueError):
            raise ValueError(f"eta, priors: expected sequences of numbers, got {self.eta!r}, "
                             f"{self.priors!r}") from None
        if len(priors) != 3:
            raise ValueError(f"priors: expected three values (G, C, U), got {self.priors!r}")
        check_recap_config(
            k=self.k, budget=self.tree_budget, max_budget=self.max_budget,
            max_depth=self.max_depth, eta=eta, priors=priors, fusion=self.fusion,
            suffix_len=self.suffix_tokens, context_capacity=self.context_capacity,
            memory_capacity=self.memory_capacity)

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
            priors=(float(self.priors[0]), float(self.priors[1]), float(self.priors[2])),
            fusion=self.fusion,
            suffix_len=self.suffix_tokens,
            suffix_adaptive=self.adaptive_suffix,
            context_capacity=self.context_capacity,
            seed_context=self.seed_context,
            reset_memory=self.reset_memory,
            frequency=self.frequency and self.auto_budget,
            frequency_floor=self.frequency_floor,
            excluded=sorted(set(self.excluded) | set(excluded)),
            memory=memory if memory is not None else self.new_memory(vocab_size),
        )
