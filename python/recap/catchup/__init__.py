"""CatchUp: recoverable visual-token routing with Local Transition Correction.

    router = recap.catchup.enable(model, budget=64)   # LLaVA, LLaVA-NeXT or Qwen2.5-VL
    model.generate(**inputs)                           # or recap.Decoder(model).generate(...)
    router.last_stats                                  # active tokens, KV bytes, FLOPs vs dense
    recap.catchup.disable(model)

At prefill, visual tokens are re-selected at a few routing layers by the attention the last
text token pays them; only the selected ones pass through the next layers and enter their
KV cache, the others wait with their cached state and may come back later, their stale state
corrected by the transition their spatial and semantic neighbours made meanwhile. Original
position ids are kept. Decoding runs every layer on the (shorter) per-layer caches.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from recap.catchup.config import MODES, CatchUpConfig
from recap.catchup.ltc import grid_distances, transition_correct
from recap.catchup.router import Router, RoutingStats
from recap.catchup.scoring import last_token_attention
from recap.state.model_state import peek, state_of


def enable(model: torch.nn.Module, config: CatchUpConfig | None = None, **settings) -> Router:
    """Routes `model`'s visual tokens from now on (replacing any routing already enabled).

    Pass a `CatchUpConfig`, or its fields as keywords (``budget=64``, ``mode="reroute"``,
    ``layers=(2, 7, 15, 23)``, ``stage_budgets=(...)``, ``m``, ``lam``, ``gamma``, ``tau``,
    ``distance``). Returns the router; its ``last_stats`` describe the latest prefill."""
    if config is not None and settings:
        raise ValueError(f"enable: pass a CatchUpConfig or keyword settings, not both; got {sorted(settings)}")
    config = config if config is not None else CatchUpConfig(**settings)
    router = Router(model, config)  # validates before anything is replaced
    disable(model)
    state_of(model).router = router
    return router


def disable(model: torch.nn.Module) -> bool:
    """Removes routing from `model`; True if it was enabled."""
    state = peek(model)
    if state is None or state.router is None:
        return False
    state.router.close()
    state.router = None
    return True


def router_of(model: torch.nn.Module) -> Router | None:
    """The router enabled on `model`, if any."""
    state = peek(model)
    return None if state is None else state.router


@contextmanager
def routed(model: torch.nn.Module, config: CatchUpConfig | None = None, **settings) -> Iterator[Router]:
    """`enable` for the duration of a ``with`` block."""
    router = enable(model, config, **settings)
    try:
        yield router
    finally:
        disable(model)


__all__ = ["MODES", "CatchUpConfig", "Router", "RoutingStats", "disable", "enable",
           "grid_distances", "last_token_attention", "router_of", "routed", "transition_correct"]
