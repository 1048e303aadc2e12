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

_LOCK = threading.Lock()


class _PerModel:
    """What recap keeps with a model. Copies of the model start without it (a deepcopy or a
    pickle of the model never carries a decoder, its memory or its state)."""

    def __init__(self) -> None:
        self.decoder = None

    def __deepcopy__(self, memo) -> _PerModel:
        return _PerModel()

    def __reduce__(self):
        return (_PerModel, ())


def state_of(model: torch.nn.Module) -> _PerModel:
    with _LOCK:
        state = model.__dict__.get("_recap_state")
        if state is None:
            state = _PerModel()
            model.__dict__["_recap_state"] = state
        return state


def decoder_for(model: torch.nn.Module):
    """The decoder `recap.generate` uses for `model` (created on first use)."""
    from recap.decoder import Decoder

    state = state_of(model)
    with _LOCK:
        if state.decoder is None:
            state.decoder = Decoder(model)
        return state.decoder


@torch.no_grad()
def generate(model: torch.nn.Module, input_ids: torch.Tensor, logits_processor=None, stopping_criteria=None,
             generation_config=None, synced_gpus: bool = False, streamer: Any = None, seed: int | None = None,
             **model_kwargs: Any) -> torch.Tensor:
    """The `custom_generate` entry point (see the module docstring). ``seed`` (passed to
    `model.generate`) makes sampling reproducible by (seed, position)."""
    from recap.request import from_transformers

    if synced_gpus:
        raise ValueError("recap.generate runs on one process; synced_gpus=True is not supported")
    if model_kwargs.get("return_dict_in_generate") or getattr(generation_config, "return_dict_in_generate", False):
        raise ValueError("recap.generate returns the token ids; return_dict_in_generate=True is not supported")
    request = from_transformers(model, input_ids, logits_processor, stopping_criteria, generation_config,
                                streamer, seed, model_kwargs)
    return decoder_for(model).run(request)
