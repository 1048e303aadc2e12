"""RECAP inside `model.generate`:

    model.generate(**inputs, custom_generate=recap.generate, do_sample=True, temperature=0.7)

transformers merges the generation config, builds the logits processors and stopping
criteria (stop strings, max_time, EOS lists), sends the prompt to the streamer, then calls
`recap.generate`, which decodes with the model's own `recap.Decoder`: one per model, kept
with the model (so the persistent memory stays warm across calls) and dropped with it.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from recap.model_state import state_of

_LOCK = threading.Lock()


def decoder_for(model: torch.nn.Module):
    """The decoder `recap.generate` uses for `model` (created on first use)."""
    from recap.decoder import Decoder

    state = state_of(model)
    with _LOCK:  # two threads' first calls build one decoder
        if state.decoder is None:
            state.decoder = Decoder(model)
        return state.decoder


@torch.no_grad()
def generate(model: torch.nn.Module, input_ids: torch.Tensor, logits_processor=None, stopping_criteria=None,
             generation_config=None, synced_gpus: bool = False, streamer: Any = None, seed: int | None = None,
             **model_kwargs: Any) -> torch.Tensor:
    """The `custom_generate` entry point (see the module docstring). ``seed`` (passed to
    `model.generate`) makes sampling reproducible by (seed, position); ``memory_pool`` (a
    `recap.MemoryPool`) and ``memory_scope`` keep the cross-request memory per scope."""
    from recap.request import from_transformers

    if synced_gpus:
        raise ValueError("recap.generate runs on one process; synced_gpus=True is not supported")
    if model_kwargs.get("return_dict_in_generate") or getattr(generation_config, "return_dict_in_generate", False):
        raise ValueError("recap.generate returns the token ids; return_dict_in_generate=True is not supported")
    scope = model_kwargs.pop("memory_scope", None)
    pool = model_kwargs.pop("memory_pool", None)
    request = from_transformers(model, input_ids, logits_processor, stopping_criteria, generation_config,
                                streamer, seed, model_kwargs)
    return decoder_for(model).run(request, memory_scope=scope, pool=pool)
