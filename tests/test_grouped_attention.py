"""Verification passes group query heads over the cache's key/value heads on a CPU instead of
copying them per query head (recap.verify.grouped_attention), with the same bits."""

from __future__ import annotations

import contextlib
import copy
import threading

import pytest
import recap
import recap.verify.tree_pass as tree_pass_module
import torch
from recap.verify.grouped_attention import grouped
from recap.verify.tree_pass import TreePass
from tiny_models import text_model
from transformers.integrations import sdpa_attention


@pytest.fixture
def repeats(monkeypatch):
    """Counts transformers' copies of key/value heads (`repeat_kv` calls)."""
    calls = []
    original = sdpa_attention.repeat_kv

    def counting(hidden, n_rep):
        calls.append(n_rep)
        return original(hidden, n_rep)

    monkeypatch.setattr(sdpa_attention, "repeat_kv", counting)
    return calls


def _passes(model, with_groups: bool, monkeypatch) -> list:
    """Packed outputs of chains of 1, 2 and 5 tokens after a 40-token context."""
    monkeypatch.setattr(tree_pass_module, "grouped", grouped if with_groups else contextlib.nullcontext)
    adapter = recap.Decoder(model).adapter
    tp = TreePass(adapter, 15)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        tp.prefill(torch.randint(3, 120, (1, 40), generator=gen), None, {})
        return [tp.chain(torch.randint(3, 120, (n,), generator=gen).tolist()) for n in (1, 2, 5)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_grouped_pass_gives_the_same_bits_without_copying_the_cache(dtype, repeats, monkeypatch):
    model = copy.deepcopy(text_model("Llama")).to(dtype)
    assert model.config.num_attention_heads > model.config.num_key_value_heads  # grouped queries
    layers = model.config.num_hidden_layers
    copied = _passes(model, False, monkeypatch)
    assert len(repeats) == 2 * 2 * layers  # keys and values, in every layer, of both multi-token passes
    repeats.clear()
    shared = _passes(model, True, monkeypatch)
    assert repeats == []
    for a, b in zip(copied, shared, strict=True):  # the one-token pass ran transformers' own path
        assert (a == b).all()


def test_grouping_holds_only_inside_the_context_and_only_on_its_thread():
    key = torch.zeros(1, 2, 8, 16)
    mask = torch.zeros(1, 1, 3, 8)
    assert not sdpa_attention.use_gqa_in_sdpa(mask, key, key)  # transformers' own answer for a mask
    inside, seen_elsewhere = threading.Event(), []
    release = threading.Event()

    def hold():
        with grouped(3) as ok:
            assert ok
            assert sdpa_attention.use_gqa_in_sdpa(mask, key, key)
            inside.set()
            release.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    assert inside.wait(5)
    seen_elsewhere.append(sdpa_attention.use_gqa_in_sdpa(mask, key, key))
    release.set()
    t.join()
    assert seen_elsewhere == [False]
    assert not sdpa_attention.use_gqa_in_sdpa(mask, key, key)
    with grouped(3):
        with grouped(2):
            pass
        assert sdpa_attention.use_gqa_in_sdpa(mask, key, key)  # nested contexts count
        with grouped(1) as ok:
            assert not ok  # a one-token pass keeps transformers' own path
    assert not sdpa_attention.use_gqa_in_sdpa(mask, key, key)
