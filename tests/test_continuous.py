"""Continuous batching (`recap.ContinuousBatch`): rows that join a running batch at any step
and leave when they end each equal their own batch-1 output, whoever shared their steps."""

from __future__ import annotations

from functools import cache

import pytest
import recap
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_batch import PAD, prompts_for
from tiny_models import text_family
from transformers import LogitsProcessor, LogitsProcessorList


@cache
def reference(family: str, prompt: tuple[int, ...], max_new: int, eos: int) -> list[int]:
    """The model's own greedy generate at batch 1 (memoised)."""
    model = text_family(family)
    ids = torch.tensor([list(prompt)])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                         eos_token_id=eos, pad_token_id=PAD)
    return out[0, ids.shape[1]:].tolist()


def run_schedule(batch: recap.ContinuousBatch, requests: list, arrivals: list[int]) -> tuple[list, list[int]]:
    """Joins request i before step arrivals[i]; steps until every row has ended. Returns the
    rows and how many rows shared each step."""
    rows: list = [None] * len(requests)
    shared, step = [], 0
    while step <= max(arrivals) or batch.rows:
        for i, at in enumerate(arrivals):
            if at == step:
                rows[i] = batch.join(requests[i])
        shared.append(len(batch.rows))
        batch.step()
        step += 1
    return rows, shared


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=5), data=st.data(), eos=st.integers(3, 99),
       drafter=st.sampled_from(["recap", "pld", "suffix", "ar"]), budget=st.sampled_from(["auto", 4, 16]),
       family=st.sampled_from(["Llama", "Qwen2"]), seed=st.integers(0, 1000))
def test_property_a_row_that_joins_at_any_step_equals_its_own_generate(lengths, data, eos, drafter, budget, family,
                                                                       seed):
    """Arrival steps, prompt lengths, lengths to generate and EOS ids drawn; Qwen2's sliding
    window is short, so rows run past it."""
    model = text_family(family)
    prompts = prompts_for(lengths, seed)
    arrivals = data.draw(st.lists(st.integers(0, 12), min_size=len(prompts), max_size=len(prompts)))
    news = data.draw(st.lists(st.integers(1, 30), min_size=len(prompts), max_size=len(prompts)))
    dec = recap.Decoder(model, recap.RecapConfig(budget=budget) if drafter == "recap" else None, drafter=drafter)
    requests = [dec.request(torch.tensor([p]), max_new_tokens=n, eos_token_id=eos)
                for p, n in zip(prompts, news, strict=True)]
    rows, _ = run_schedule(recap.ContinuousBatch(dec), requests, arrivals)
    for i, row in enumerate(rows):
        assert row.ended and row.error is None
        assert row.out == reference(family, tuple(prompts[i]), news[i], eos), f"row {i} joined at {arrivals[i]}"


def test_rows_join_while_others_decode_and_share_their_passes():
    model = text_family("Llama")
    prompts = prompts_for([5, 23, 40, 11, 17])
    dec = recap.Decoder(model)
    batch = recap.ContinuousBatch(dec)
    requests = [dec.request(torch.tensor([p]), max_new_tokens=30, eos_token_id=None) for p in prompts]
    rows, shared = run_schedule(batch, requests, [0, 2, 2, 5, 9])
    assert [row.out for row in rows] == [reference("Llama", tuple(p), 30, -1) for p in prompts]
    assert max(shared) >= 3  # rows really decoded together
    assert batch.stats.passes < sum(row.stats.steps for row in rows)  # passes were shared
    for row in rows:
        assert row.stats.new_tokens == 30 and row.stats.tau == pytest.approx(29 / row.stats.steps)
    assert batch.rows == [] and batch._tp is None  # the slab is freed once the batch is empty


def test_a_seeded_sampled_row_repeats_its_own_generate():
    model = text_family("Llama")
    prompts = prompts_for([12, 30, 7])
    dec = recap.Decoder(model)
    kw = dict(max_new_tokens=25, do_sample=True, temperature=0.9, top_p=0.95, eos_token_id=None)
    alone = [dec.generate(torch.tensor([p]), seed=11 + i, **kw)[0, len(p):].tolist() for i, p in enumerate(prompts)]
    requests = [dec.request(torch.tensor([p]), seed=11 + i, **kw) for i, p in enumerate(prompts)]
    rows, _ = run_schedule(recap.ContinuousBatch(dec), requests, [0, 3, 4])
    assert [row.out for row in rows] == alone


class _Streamer:
    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended = 0

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value.reshape(-1).tolist())

    def end(self) -> None:
        self.ended += 1


class _FailsAt(LogitsProcessor):
    """Raises once the sequence is `at` tokens long (a user's processor failing mid-request)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def __call__(self, input_ids, scores):
        if input_ids.shape[-1] >= self.at:
            raise RuntimeError("a processor failed")
        return scores


def test_each_row_streams_its_own_tokens_and_a_failing_row_fails_alone():
    model = text_family("Llama")
    prompts = prompts_for([9, 14, 20])
    dec = recap.Decoder(model)
    streams = [_Streamer() for _ in prompts]
    bad = dec.request(torch.tensor([prompts[1]]), max_new_tokens=30, eos_token_id=None, streamer=streams[1],
                      logits_processor=LogitsProcessorList([_FailsAt(len(prompts[1]) + 6)]))
    requests = [dec.request(torch.tensor([p]), max_new_tokens=30, eos_token_id=None, streamer=s)
                for p, s in zip(prompts, streams, strict=True)]
    requests[1] = bad
    rows, _ = run_schedule(recap.ContinuousBatch(dec), requests, [0, 1, 2])
    assert isinstance(rows[1].error, RuntimeError) and "a processor failed" in str(rows[1].error)
    for i in (0, 2):
        assert rows[i].error is None and rows[i].out == reference("Llama", tuple(prompts[i]), 30, -1)
        s = streams[i]
        assert s.puts[0] == prompts[i] and sum(s.puts[1:], []) == rows[i].out and s.ended == 1
    assert streams[1].ended == 1
    # A processor failing at the first token fails the join and leaves the batch as it was.
    batch = recap.ContinuousBatch(dec)
    batch.join(requests[0])
    with pytest.raises(RuntimeError, match="a processor failed"):
        batch.join(dec.request(torch.tensor([prompts[2]]), max_new_tokens=5, eos_token_id=None,
                               logits_processor=LogitsProcessorList([_FailsAt(0)])))
    assert len(batch.rows) == 1 and batch._tp is not None and batch._tp.rows == 1
    while batch.rows:
        batch.step()


def test_join_refuses_a_batch_or_padding_with_a_clear_error():
    model = text_family("Llama")
    dec = recap.Decoder(model)
    batch = recap.ContinuousBatch(dec)
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    with pytest.raises(ValueError, match="one prompt without padding"):
        batch.join(dec.request(ids, max_new_tokens=4))
    with pytest.raises(ValueError, match="with padding"):
        batch.join(dec.request(torch.tensor([[0, 5, 6]]), torch.tensor([[0, 1, 1]]), max_new_tokens=4))
