"""Settings of visual-token routing, and how an average budget becomes per-stage budgets."""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("dense", "fastv", "pyramiddrop", "reroute", "catchup")
DEFAULT_LAYERS_32 = (2, 7, 15, 23)  # the method's routing layers for a 32-layer decoder
DISTANCES = ("diagonal", "side", "patches")
PYRAMID_RATIO = 0.5  # PyramidDrop keeps this share of the previous stage's tokens


@dataclass(frozen=True)
class CatchUpConfig:
    """How one model's visual tokens are routed.

    ``budget`` is the average number of active visual tokens per decoder layer, counting the
    dense layers before the first routing layer at every visual token (so budget 64 of 576
    tokens is 88.9% fewer active visual tokens); ``stage_budgets`` gives each routing stage's
    K instead. ``mode``:

    - ``"dense"``: no routing (statistics only);
    - ``"fastv"``: one cut at the first routing layer;
    - ``"pyramiddrop"``: a monotonic cascade, each stage keeping half the previous one's tokens;
    - ``"reroute"``: recoverable routing (a deferred token may come back) with stale states;
    - ``"catchup"``: recoverable routing with Local Transition Correction of re-admitted states.

    LTC (catchup only): ``m`` anchors, spatial weight ``lam``, step ``gamma``, temperature
    ``tau``; ``distance`` normalises patch-grid distances by the grid diagonal
    (``"diagonal"``, the default, so distances lie in [0, 1]), by the longer grid side
    (``"side"``), or not at all (``"patches"``).
    """

    mode: str = "catchup"
    budget: int | None = 64
    stage_budgets: tuple[int, ...] | None = None
    layers: tuple[int, ...] | None = None
    m: int = 8
    lam: float = 0.15
    gamma: float = 0.8
    tau: float = 0.07
    distance: str = "diagonal"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)}; got {self.mode!r}")
        if self.distance not in DISTANCES:
            raise ValueError(f"distance: expected one of {', '.join(DISTANCES)}; got {self.distance!r}")
        if self.stage_budgets is not None:
            object.__setattr__(self, "stage_budgets", tuple(self.stage_budgets))
            if not self.stage_budgets or any(not _is_int(k) or k < 1 for k in self.stage_budgets):
                raise ValueError(f"stage_budgets: expected positive integers; got {self.stage_budgets!r}")
        elif self.mode != "dense" and (self.budget is None or not _is_int(self.budget) or self.budget < 1):
            raise ValueError(f"budget: expected a positive integer (average visual tokens per layer); "
                             f"got {self.budget!r}")
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(self.layers))
            if not self.layers or any(not _is_int(x) for x in self.layers) or \
                    list(self.layers) != sorted(set(self.layers)):
                raise ValueError(f"layers: expected strictly increasing layer indices; got {self.layers!r}")
        if not _is_int(self.m) or self.m < 1:
            raise ValueError(f"m: expected a positive integer; got {self.m!r}")
        if self.tau <= 0:
            raise ValueError(f"tau: expected a positive temperature; got {self.tau!r}")
        if self.lam < 0:
            raise ValueError(f"lam: expected a non-negative weight; got {self.lam!r}")

    @property
    def gamma_used(self) -> float:
        return self.gamma if self.mode == "catchup" else 0.0

    @property
    def monotonic(self) -> bool:
        return self.mode in ("fastv", "pyramiddrop")

    def routing_layers(self, num_layers: int) -> tuple[int, ...]:
        """The layers at whose input visual tokens are (re)selected, checked against the model."""
        if self.mode == "dense":
            return ()
        if self.layers is None:
            scaled = sorted({max(1, min(num_layers - 1, round(x * num_layers / 32))) for x in DEFAULT_LAYERS_32})
            layers = tuple(scaled)
        else:
            layers = self.layers
            bad = [x for x in layers if not 0 <= x < num_layers]
            if bad:
                raise ValueError(f"layers: the model has {num_layers} decoder layers (0-{num_layers - 1}); "
                                 f"got routing layers {bad} out of range")
        if self.mode == "fastv":
            layers = layers[:1]
        if self.stage_budgets is not None and len(self.stage_budgets) != len(layers):
            raise ValueError(f"stage_budgets: expected one K per routing layer {list(layers)}; "
                             f"got {len(self.stage_budgets)}")
        return layers

    def stage_ks(self, visual: int, num_layers: int, layers: tuple[int, ...]) -> list[int]:
        """K of every stage, so that the average over all layers (dense prefix counted at
        `visual`) is the budget. Errors say what was asked and what the prompt allows."""
        if self.stage_budgets is not None:
            ks = list(self.stage_budgets)
            if max(ks) > visual:
                raise ValueError(f"stage_budgets: a stage keeps at most the {visual} visual tokens of this "
                                 f"prompt; got {ks}")
            return ks
        budget = self.budget
        if budget is None:
            raise ValueError("budget: expected a positive integer (average visual tokens per layer) or "
                             "stage_budgets; got neither")
        if budget > visual:
            raise ValueError(f"budget: this prompt has {visual} visual tokens; got an average budget of "
                             f"{budget} per layer (use at most {visual}, or mode='dense')")
        ends = list(layers[1:]) + [num_layers]
        lengths = [e - s for s, e in zip(layers, ends, strict=True)]
        routed = budget * num_layers - layers[0] * visual  # token-layers left for the stages
        if self.mode == "pyramiddrop":
            weights = [PYRAMID_RATIO ** i for i in range(len(layers))]
        else:
            weights = [1.0] * len(layers)
        # Solve sum_s len_s * min(visual, k0 * w_s) = routed for k0 (stages saturate at `visual`).
        lo, hi = 0.0, visual / min(weights)
        for _ in range(60):
            k0 = (lo + hi) / 2
            if sum(n * min(visual, k0 * w) for w, n in zip(weights, lengths, strict=True)) < routed:
                lo = k0
            else:
                hi = k0
        ks = [min(visual, round(hi * w)) for w in weights]
        if min(ks) < 1:
            raise ValueError(
                f"budget: an average of {self.budget} visual tokens per layer over {num_layers} layers "
                f"cannot be met with {layers[0]} dense layers of {visual} visual tokens before the first "
                f"routing layer; raise the budget, route earlier (layers=...) or give stage_budgets")
        return ks


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
