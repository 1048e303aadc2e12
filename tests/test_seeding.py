"""Seeding budgeted like the tree (recap.verify.seeding): where the head is dear, only the prompt's
last positions seed the memories; outputs never change."""

import copy

import numpy as np
import pytest
import recap
import torch
from recap.state.model_state import state_of
from recap.verify import seeding
from session_spy import DrafterSpy
from tiny_models import text_family


def test_positions_follow_the_heads_share():
    assert seeding.positions(2000, 0.1) == 800  # SEED_SHARE (4%) of the forward's time
    assert seeding.positions(60, 0.45) == int(seeding.SEED_FLOOR / 0.45)  # 4% would be 5 positions: the floor
    assert seeding.positions(693, 0.9) == int(0.04 * 693 / 0.9)  # a longer prompt: 4% is above the floor
    assert seeding.positions(693, 0.01) == 693  # a cheap head: every position
    assert seeding.positions(30, 0.1) == 30 and seeding.positions(100, 0.8) == int(seeding.SEED_FLOOR / 0.8)
    assert seeding.positions(60, 8.0) == 0  # a head dearer than the floor's worth: nothing seeded
    assert seeding.positions(50, 0.0) == 50


def test_a_dear_head_seeds_only_the_prompts_end_and_output_is_unchanged():
    model = copy.deepcopy(text_family("Llama"))
    prompt = torch.tensor([list(range(3, 43)) * 5])  # 200 tokens
    want = model.generate(prompt, max_new_tokens=24, do_sample=False)
    for share, rows in ((0.5, int(0.04 * 200 / 0.5)), (1e-3, 200)):
        dec = recap.Decoder(model)
        dec.calibrate()
        state_of(model).head_share = share  # what the next prefill seeds by
        spy = DrafterSpy.install(dec)
        assert torch.equal(dec.generate(prompt, max_new_tokens=24), want)
        assert len(spy.seeded[-1]) == rows and spy.starts[-1] == 200 - rows


def test_each_seeding_prefill_corrects_the_share_towards_what_it_cost(tmp_path, monkeypatch):
    monkeypatch.setenv("RECAP_CACHE", "1")
    monkeypatch.setenv("RECAP_CACHE_DIR", str(tmp_path))
    model = copy.deepcopy(text_family("Llama"))
    dec = recap.Decoder(model)
    dec.calibrate()
    state_of(model).head_share = 0.1
    adapter = dec.adapter
    # 64 positions seeded in 0.2 s after a 512-token forward of 1 s: a share of 1.6.
    seeding.observe(adapter, 512, 1.0, 64, 0.2)
    assert state_of(model).head_share == pytest.approx(0.1 + seeding.OBSERVE_WEIGHT * 1.5)
    assert dec.seed_share() == state_of(model).head_share
    stored = list(tmp_path.rglob("*.json"))
    assert stored, "the corrected share is kept for the next process"
    before = state_of(model).head_share
    seeding.observe(adapter, 40, 1.0, 8, 0.2)  # too short to judge by
    assert state_of(model).head_share == before
    # A real prefill that seeds corrects it too.
    state_of(model).head_share = 1e-6  # seeds every position of the 200-token prompt
    dec.generate(torch.tensor([list(range(3, 43)) * 5]), max_new_tokens=2)
    assert state_of(model).head_share > 1e-6


def test_the_first_share_is_estimated_from_the_parameter_counts_and_replaced_by_what_a_prefill_cost():
    model = copy.deepcopy(text_family("Qwen2"))
    head, body = model.lm_head.weight.numel(), sum(p.numel() for p in model.model.layers.parameters())
    body += sum(p.numel() for p in model.model.norm.parameters())
    assert seeding.estimated_share(model) == pytest.approx(seeding.HEAD_OVERHEAD * head / (head + body))
    dec = recap.Decoder(model)
    dec.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2)  # first use: no forward measures the share
    assert state_of(model).head_share is None and dec.seed_share() == seeding.estimated_share(model)
    dec.generate(torch.tensor([list(range(3, 43)) * 5]), max_new_tokens=2)  # a prefill long enough to time
    assert state_of(model).head_share is not None and dec.seed_share() == state_of(model).head_share
    assert recap.Decoder(model, drafter="pld")._head_share is None  # no memory: nothing to seed


def test_seed_rows_land_at_their_start():
    d = recap.Drafter.tr(64, k=2)
    with d.session() as s:
        s.begin(np.arange(10, 20))
        ids = np.tile(np.array([[1, 2]]), (4, 1))
        s.seed(ids, np.full((4, 2), 0.5, dtype=np.float32), start=6)  # rows of tokens 16..19
        assert len(s.memory) == 4
        try:
            s.seed(ids, np.full((4, 2), 0.5, dtype=np.float32), start=7)
        except ValueError as e:
            assert "from position 7" in str(e)
        else:
            raise AssertionError("seed rows past the history were accepted")
