"""Every model-specific fact, in one place: `adapter_for(model)` returns the model's adapter
(`base.ModelAdapter` or a family's subclass from `families/`), after the structural check in
`capability`; `conformance.probe` checks on first use that tree passes equal one-token passes."""

from recap.adapters.base import ModelAdapter
from recap.adapters.capability import UnsupportedModelError
from recap.adapters.registry import adapter_for, known_families


def is_vision_language(config) -> bool:
    """Whether a transformers config describes a model that takes images."""
    return getattr(config, "vision_config", None) is not None


__all__ = ["ModelAdapter", "UnsupportedModelError", "adapter_for", "known_families", "is_vision_language"]
