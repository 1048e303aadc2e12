"""Batches: every row of a batched `recap.Decoder.generate` equals that row's `generate` at
batch 1 (and batched `generate`'s row with the same left padding), whatever the drafter,
budget, prompt lengths and stopping points."""

from __future__ import annotations

import numpy as np
import pytest
import recap
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recap._core import BatchWidth
from session_spy import DrafterSpy
from tiny_models import TEXT_FAMILIES, gemma3_vl_inputs, llava_inputs, qwen_vl_inputs, text_family

PAD = 0
NEW = 40


def prompts_for(lengths: list[int], seed: int = 0) -> list[list[int]]:
    """Prompts that repeat a phrase (so drafts are accepted) or are random, of the given lengths."""
    g = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(lengths):
        phrase = g.integers(3, 100, 7 + i).tolist()
        out.append((phrase * (n // len(phrase) + 1))[:n] if i % 2 == 0 else g.integers(3, 100, n).tolist())
    return out


def left_pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def batch_inputs(rows: list[dict]) -> dict:
    """Per-row model inputs ([1, L_i] token tensors, per-image tensors) as one left-padded
    batch, as a processor with padding_side="left" returns them."""
    width = max(r["input_ids"].shape[1] for r in rows)
    out = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        if values[0].dim() == 2 and values[0].shape[0] == 1 and values[0].shape[1] == rows[0]["input_ids"].shape[1]:
            fill = PAD if key == "input_ids" else 0
            padded = torch.full((len(rows), width), fill, dtype=values[0].dtype)
            for i, v in enumerate(values):
                padded[i, width - v.shape[1]:] = v[0]
            out[key] = padded
        else:
            out[key] = torch.cat(values, dim=0)
    return out


def one_by_one(model, rows: list[dict], **kw) -> list[list[int]]:
    """Each row's new tokens from transformers' generate at batch 1."""
    outs = []
    for r in rows:
        o = model.generate(**r, do_sample=False, pad_token_id=PAD, max_new_tokens=NEW, **kw)
        outs.append(o[0, r["input_ids"].shape[1]:].tolist())
    return outs


def assert_rows(out: torch.Tensor, width: int, expected: list[list[int]], pad: int = PAD) -> None:
    for i, want in enumerate(expected):
        got = out[i, width:].tolist()
        assert got[:len(want)] == want, f"row {i}: {got[:len(want)]} != {want}"
        assert all(t == pad for t in got[len(want):]), f"row {i}: not padded after its end: {got}"


DRAFTERS = [("recap", recap.RecapConfig()), ("recap", recap.RecapConfig(budget=16)), ("pld", None),
            ("tr", None), ("suffix", None), ("ar", None)]


def assert_text_family_batches(family: str, drafters) -> None:
    """Four rows of mixed lengths: each equals its generate at batch 1 and batched generate's row."""
    model = text_family(family)
    rows = prompts_for([5, 23, 40, 11])
    ids, mask = left_pad(rows)
    expected = one_by_one(model, [dict(input_ids=torch.tensor([r])) for r in rows])
    batched = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=PAD,
                             max_new_tokens=NEW)
    for name, cfg in drafters:
        out = recap.Decoder(model, cfg, drafter=name).generate(ids, attention_mask=mask, max_new_tokens=NEW,
                                                               pad_token_id=PAD)
        assert_rows(out, ids.shape[1], expected)
        if family != "Gemma 2":
            # transformers' own batched Gemma 2 (eager attention, sliding window) turns padding
            # rows into NaN that reach the real tokens, so its batched generate is not its
            # batch-1 generate; recap's rows still are (see prefill._zero_padding).
            assert torch.equal(out, batched), name


@pytest.mark.parametrize("family", list(TEXT_FAMILIES))
def test_every_text_family_batched_equals_batch_1_and_batched_generate(family):
    assert_text_family_batches(family, DRAFTERS if family == "Llama" else DRAFTERS[:1] + DRAFTERS[2:3])


@pytest.mark.parametrize("family", list(TEXT_FAMILIES))
def test_a_padded_prefill_as_on_an_accelerator_keeps_every_row_its_own_generate(family, monkeypatch):
    """On an accelerator text rows are prefilled as one left-padded pass (prefill.one_padded_prefill);
    forced here on the CPU, every row still equals its generate at batch 1 and batched generate's."""
    import recap.verify.prefill as prefill

    monkeypatch.setattr(prefill, "one_padded_prefill", lambda device: True)
    assert_text_family_batches(family, DRAFTERS[:1] + DRAFTERS[2:3])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=6), eos=st.integers(3, 99),
       drafter=st.sampled_from(["recap", "pld", "tr", "sam", "ar"]), budget=st.sampled_from(["auto", 4, 16, 48]),
       family=st.sampled_from(["Llama", "Qwen2"]), seed=st.integers(0, 1000))
def test_property_every_row_equals_its_own_generate(lengths, eos, drafter, budget, family, seed):
    """Batch sizes 1-6, any prompt lengths, an EOS id drawn so rows stop at different points."""
    model = text_family(family)
    rows = prompts_for(lengths, seed)
    ids, mask = left_pad(rows)
    expected = one_by_one(model, [dict(input_ids=torch.tensor([r])) for r in rows], eos_token_id=eos)
    cfg = recap.RecapConfig(budget=budget) if drafter == "recap" else None
    dec = recap.Decoder(model, cfg, drafter=drafter)
    out = dec.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=PAD)
    assert_rows(out, ids.shape[1], expected)
    assert out.shape[1] == ids.shape[1] + max(len(e) for e in expected)
    batched = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=PAD,
                             max_new_tokens=NEW, eos_token_id=eos)
    assert torch.equal(out, batched)


@pytest.mark.parametrize("drafter, budget", [("pld", None), ("recap", "auto"), ("recap", 16)])
def test_no_row_drafts_past_the_length_limit(drafter, budget):
    model = text_family("Llama")
    rows = [[5, 6, 7, 8, 9, 10] * 5, [20, 21, 22, 23, 24] * 6]  # both 30 tokens, both repeating
    ids, mask = left_pad(rows)
    expected = one_by_one(model, [dict(input_ids=torch.tensor([r])) for r in rows])
    for max_new in (4, 9):
        dec = recap.Decoder(model, recap.RecapConfig(budget=budget) if budget else None, drafter=drafter)
        spy = DrafterSpy.install(dec)
        out = dec.generate(ids, attention_mask=mask, max_new_tokens=max_new, pad_token_id=PAD)
        assert_rows(out, ids.shape[1], [e[:max_new] for e in expected])
        done = [h - 30 for h in spy.histories]
        assert spy.depths and all(d <= max_new - n - 1 for d, n in zip(spy.depths, done, strict=True))


def test_sampling_row_i_equals_batch_1_with_its_seed():
    model = text_family("Llama")
    rows = prompts_for([6, 19, 12])
    ids, mask = left_pad(rows)
    dec = recap.Decoder(model)
    kw = dict(do_sample=True, temperature=0.8, top_k=40, max_new_tokens=30, pad_token_id=PAD)
    out = dec.generate(ids, attention_mask=mask, seed=11, **kw)
    listed = dec.generate(ids, attention_mask=mask, seed=[11, 12, 13], **kw)
    assert torch.equal(out, listed)  # one int s gives row i the seed s + i
    ar = recap.Decoder(model, drafter="ar")
    for i, r in enumerate(rows):
        alone = ar.generate(torch.tensor([r]), seed=11 + i, **kw)[0, len(r):].tolist()
        assert_rows(out[i:i + 1], ids.shape[1], [alone])
    other = dec.generate(ids, attention_mask=mask, seed=[11, 99, 13], **kw)
    assert torch.equal(other[0], out[0]) and torch.equal(other[2], out[2])  # a row depends only on its seed


def test_processors_see_each_rows_own_history():
    model = text_family("Llama")
    rows = prompts_for([8, 21])
    ids, mask = left_pad(rows)
    kw = dict(repetition_penalty=1.3, no_repeat_ngram_size=3, max_new_tokens=NEW, pad_token_id=PAD)
    batched = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, **kw)
    assert torch.equal(recap.Decoder(model).generate(ids, attention_mask=mask, **kw), batched)


def test_custom_generate_takes_the_batch():
    model = text_family("Qwen3")
    rows = prompts_for([4, 17, 9])
    ids, mask = left_pad(rows)
    want = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=PAD, max_new_tokens=NEW)
    got = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=PAD, max_new_tokens=NEW,
                         custom_generate=recap.generate)
    assert torch.equal(got, want)
    d = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=PAD, max_new_tokens=NEW,
                       custom_generate=recap.generate, return_dict_in_generate=True)
    assert torch.equal(d.sequences, want) and d.recap_stats["rows"] == 3


IMAGES = ["skimage_chelsea.png", "skimage_coins.png", "skimage_camera.png"]  # different sizes and aspect ratios
VLMS = {
    "qwen2_vl": lambda p, s, i: qwen_vl_inputs(p, s, image=IMAGES[i], family="qwen2_vl"),
    "llava": lambda p, s, i: llava_inputs(p, s, image=IMAGES[i]),
    "gemma3": lambda p, s, i: gemma3_vl_inputs(p, s),
}


@pytest.mark.parametrize("family", list(VLMS))
def test_vision_language_batches_with_images_equal_each_rows_generate(family):
    parts = [([5, 6, 7], [8, 9, 10, 11] * 3), ([12], [13, 14] * 9), ([20, 21, 22, 23, 24, 25], [26])]
    built = [VLMS[family](p, s, i) for i, (p, s) in enumerate(parts)]
    model, rows = built[0][0], [b[1] for b in built]
    expected = one_by_one(model, rows)
    batch = batch_inputs(rows)
    batched = model.generate(**batch, do_sample=False, pad_token_id=PAD, max_new_tokens=NEW)
    for name in ("recap", "pld"):
        out = recap.Decoder(model, drafter=name).generate(**batch, max_new_tokens=NEW, pad_token_id=PAD)
        assert_rows(out, batch["input_ids"].shape[1], expected)
        assert torch.equal(out, batched), name


def test_rows_have_their_own_memory_scopes():
    model = text_family("Llama")
    rows = prompts_for([9, 14])
    ids, mask = left_pad(rows)
    dec = recap.Decoder(model, memory=recap.MemoryPool(max_bytes=1 << 26))
    out = dec.generate(ids, attention_mask=mask, max_new_tokens=NEW, pad_token_id=PAD, memory_scope=["a", "b"])
    assert torch.equal(out, model.generate(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=PAD,
                                           max_new_tokens=NEW))
    assert dec.pool.stats()["a"]["rows"] > 0 and dec.pool.stats()["b"]["rows"] > 0
    with pytest.raises(ValueError, match="one scope per row"):
        dec.generate(ids, attention_mask=mask, max_new_tokens=4, memory_scope=["a"])


def test_bad_batches_raise_clear_errors():
    model = text_family("Llama")
    ids, mask = left_pad(prompts_for([5, 9]))
    dec = recap.Decoder(model)
    right = torch.flip(mask, dims=[1])
    with pytest.raises(ValueError, match="not left-padded"):
        dec.generate(ids, attention_mask=right, max_new_tokens=4)
    with pytest.raises(ValueError, match="shaped like input_ids"):
        dec.generate(ids, attention_mask=mask[:, 1:], max_new_tokens=4)
    with pytest.raises(ValueError, match="no tokens"):
        dec.generate(ids, attention_mask=torch.zeros_like(mask), max_new_tokens=4)
    with pytest.raises(ValueError, match="one int per row"):
        dec.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=True, seed=[1])
    with pytest.raises(ValueError, match="streamer"):
        dec.generate(ids, attention_mask=mask, max_new_tokens=4, streamer=object())
    with pytest.raises(ValueError, match="output_scores"):
        dec.generate(ids, attention_mask=mask, max_new_tokens=4, return_dict_in_generate=True, output_scores=True)


def test_batch_width_controller_spends_where_it_pays():
    points = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    flat = BatchWidth(points, [1.0] * len(points), 17)
    steep = BatchWidth(points, points, 17)
    copying = np.concatenate([[0.0], np.cumsum(np.full(16, 0.95))]).astype(np.float32)  # a long verbatim copy
    open_text = np.array([0.0, 0.2, 0.25], dtype=np.float32)
    assert flat.width([copying, open_text]) == 17  # free nodes: take them all
    assert steep.width([open_text, open_text]) == 1  # a pass per token: drafting never pays
    mid = BatchWidth(points, [1.0 + 0.05 * p for p in points], 17)
    wide = mid.width([copying, open_text])
    assert wide > mid.width([open_text, open_text]) >= 1
    # Wide passes measured far slower than the prior (narrow ones as predicted) make them
    # less attractive.
    for _ in range(20):
        mid.observe(2, 1, mid.prior(2.0))
        mid.observe(2, wide, 10.0)
    assert mid.width([copying, open_text]) < wide
    with pytest.raises(ValueError, match="rising token counts"):
        BatchWidth([2.0, 1.0], [1.0, 1.0], 4)
