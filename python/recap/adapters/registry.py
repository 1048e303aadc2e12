"""One registry: every module that needs a model-specific fact asks `adapter_for(model)`.

Families that need special handling live one file each in `recap/adapters/families/`; each
defines subclasses of `ModelAdapter` with the `model_types` they handle. Every other model
that passes the structural check gets the generic adapter.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

import torch

from recap.adapters.base import ModelAdapter, text_config
from recap.adapters.capability import check_structure


@cache
def known_families() -> tuple[type[ModelAdapter], ...]:
    package = importlib.import_module("recap.adapters.families")
    found: list[type[ModelAdapter]] = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        found += [obj for obj in vars(module).values()
                  if isinstance(obj, type) and issubclass(obj, ModelAdapter) and obj.model_types
                  and obj.__module__ == module.__name__]
    return tuple(found)


def family_of(model: torch.nn.Module) -> type[ModelAdapter]:
    types = [getattr(model.config, "model_type", None), getattr(text_config(model), "model_type", None)]
    for model_type in types:  # the outer (multimodal) type first
        for fam in known_families():
            if model_type in fam.model_types:
                return fam
    return ModelAdapter


def adapter_for(model: torch.nn.Module) -> ModelAdapter:
    """A new adapter of `model` (cheap: it reads the config and finds a few modules; it holds
    the model, so it is not cached with it); `UnsupportedModelError` naming the reason otherwise."""
    check_structure(model, known_families())
    return family_of(model)(model)


def routed_families() -> list[str]:
    """The model types `recap.catchup` routes."""
    return sorted(t for f in known_families() if f.routing for t in f.model_types)


def require_routing(adapter: ModelAdapter) -> None:
    """Raises TypeError naming the routed families when `adapter`'s model is not one."""
    if not adapter.routing:
        raise TypeError(f"recap.catchup does not route {type(adapter.model).__name__} "
                        f"(model_type {adapter.text_config.model_type!r}); routed families: "
                        f"{', '.join(routed_families())}")
