"""Per-architecture details of tree verification: which models are supported, which token
ids must never be drafted, how tree positions are formed, and where the final hidden
states of the prefill are read for seeding."""

from __future__ import annotations

from dataclasses import dataclass

import torch

TEXT_MODELS = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MistralForCausalLM",
    "GemmaForCausalLM",
)
VLM_MODELS = (
    "Qwen2_5_VLForConditionalGeneration",
    "LlavaForConditionalGeneration",
    "LlavaNextForConditionalGeneration",
)
SUPPORTED = TEXT_MODELS + VLM_MODELS


@dataclass
class ModelAdapter:
    """What the decoder needs to know about one loaded model."""

    model: torch.nn.Module
    vocab_size: int
    excluded: tuple[int, ...] = ()
    mrope: bool = False
    # Sliding-window caches are compacted correctly only while the sequence fits the window.
    sliding_window: int | None = None
    final_norm: torch.nn.Module | None = None

    def tree_positions(self, cache_len: int, depths: torch.Tensor) -> torch.Tensor:
        """Position ids [1, T] of the tree nodes: cache length + depth (+ M-RoPE delta)."""
        pos = (depths + cache_len).unsqueeze(0)
        if self.mrope:
            deltas = getattr(self.model.model, "rope_deltas", None)
            if deltas is not None:
                pos = pos + deltas.to(pos.device).reshape(1, 1)
        return pos


def _text_config(model: torch.nn.Module):
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def adapter_for(model: torch.nn.Module) -> ModelAdapter:
    """The adapter of a supported model; a clear error listing what is supported otherwise."""
    name = type(model).__name__
    if name not in SUPPORTED:
        raise TypeError(
            f"recap.Decoder supports {', '.join(SUPPORTED)}; got a {name}. "
            "Other decoder-only causal LMs with a standard DynamicCache may work but are not tested."
        )
    text_cfg = _text_config(model)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    window = getattr(text_cfg, "sliding_window", None)
    if getattr(text_cfg, "use_sliding_window", True) is False:
        window = None
    excluded: list[int] = []
    for attr in ("image_token_id", "video_token_id", "image_token_index"):
        tid = getattr(model.config, attr, None)
        if isinstance(tid, int) and 0 <= tid < vocab:
            excluded.append(tid)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    if hasattr(decoder, "language_model"):
        decoder = decoder.language_model
    norm = getattr(decoder, "norm", None)
    return ModelAdapter(
        model=model,
        vocab_size=vocab,
        excluded=tuple(sorted(set(excluded))),
        mrope=name == "Qwen2_5_VLForConditionalGeneration",
        final_norm=norm,
        sliding_window=int(window) if window else None,
    )
