"""What a model must be for tree verification, decided from the model, not its class name:
decoder-only attention whose cache holds one key/value entry per token (so rejected tree
entries can be cropped and accepted ones gathered), honouring a 4D additive mask and
explicit position ids. The last two are checked by the conformance probe on first use;
the structural part is checked here, up front, with the reason named."""

from __future__ import annotations

from typing import Any

from recap.adapters.base import ATTENTION_TYPES, layer_types, text_config

WHY_STATE = ("their state cannot be rolled back to the accepted path of a draft tree, nor can it see "
             "a tree attention mask")


class UnsupportedModelError(TypeError):
    """The model cannot be verified with draft trees; the message says why."""


def check_structure(model: Any, families: tuple = ()) -> None:
    """Raises `UnsupportedModelError` naming the reason when `model` cannot be tree-verified.
    `families`: the adapter classes (`recap.adapters.registry.known_families`), whose
    `refusal` may refuse a model type they name."""
    name = type(model).__name__
    cfg = getattr(model, "config", None)
    if cfg is None or not callable(getattr(model, "get_output_embeddings", None)) \
            or model.get_output_embeddings() is None:
        raise UnsupportedModelError(
            f"recap.Decoder expects a transformers model with a language-model head (a ...ForCausalLM or "
            f"...ForConditionalGeneration); got a {name} without one")
    if getattr(cfg, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"{name} is an encoder-decoder model; recap.Decoder verifies draft trees in decoder-only models")
    tcfg = text_config(model)
    for model_type in (getattr(cfg, "model_type", None), getattr(tcfg, "model_type", None)):
        for family in families:
            reason = family.refusal(model_type) if model_type in family.model_types else None
            if reason is not None:
                raise UnsupportedModelError(f"{name} (model_type {model_type!r}) {reason}")
    types = layer_types(tcfg)
    other = sorted({t for t in types if t not in ATTENTION_TYPES and t != "dummy"})
    if "chunked_attention" in other:
        raise UnsupportedModelError(
            f"{name} uses chunked attention (layer types {other}); recap.Decoder handles full and "
            "sliding-window attention layers only")
    if other:
        raise UnsupportedModelError(f"{name} has {', '.join(other)} layers: {WHY_STATE}")
    if getattr(tcfg, "kv_sharing_modes", None) is not None or getattr(tcfg, "num_kv_shared_layers", None):
        raise UnsupportedModelError(
            f"{name} shares key/value caches between layers; recap.Decoder needs one cache per attention layer")
    if not any(t in ATTENTION_TYPES for t in types):
        raise UnsupportedModelError(f"{name} has no attention layers (layer types {sorted(set(types))})")
