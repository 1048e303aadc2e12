"""budget="auto": the cost curve, the cut of each tree, and greedy equivalence."""

import numpy as np
import pytest
import recap
import torch
from recap import RecapConfig
from recap._core import recap_defaults
from tiny_models import text_model

V = 50


# A repetitive history: a session begun on it drafts a long suffix chain first.
WARM = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3], dtype=np.int64)


def warm_drafter(cost):
    """A session of a RECAP drafter (given `cost`, when not None) begun on WARM."""
    drafter = RecapConfig(budget="auto", max_budget=32).new_drafter(V)
    if cost is not None:
        drafter.set_cost(cost)
    d = drafter.session()
    d.begin(WARM)
    return d


def test_the_drafter_corrects_the_measured_curve_from_step_timings():
    """The controller lives in Rust: measured points in, each step's timings through
    observe_packed, its state out (interpolation and corrections are unit-tested there)."""
    drafter = RecapConfig(budget="auto", max_budget=32).new_drafter(V)
    drafter.set_cost_points([1, 4, 8, 64], [0.010, 0.016, 0.024, 0.1])
    d = drafter.session()
    d.begin(WARM)
    for step in range(40):
        t = d.propose()
        n = len(t)
        pred = np.full(n, V - 1, dtype=np.int64)
        ids = np.tile(np.arange(V - 8, V, dtype=np.int64)[::-1], (n, 1))
        packed = np.concatenate([pred[:, None], ids, np.full((n, 8), 0.1)], axis=1).astype(np.float32)
        base = float(np.interp(n, [1, 4, 8, 64], [0.010, 0.016, 0.024, 0.1]))
        d.observe_packed(packed, 8, 3 * base, 0.002 if step else None)  # passes take 3x the measurement
    state = d.cost_state()
    assert state["observed_steps"] == 40 and state["points"] == [1, 4, 8, 64]
    assert state["global_ratio"] == pytest.approx(3.0, rel=0.05)
    assert state["host_ms"] == pytest.approx(2.0 * (1 - 0.95 ** 39), rel=1e-3)
    drafter.set_cost([1.0] * 64)  # a given curve replaces the online one, for sessions opened from now on
    assert d.cost_state() is not None and drafter.session().cost_state() is None
    with pytest.raises(ValueError, match="cost points"):
        drafter.set_cost_points([4, 1], [0.1, 0.2])


def test_cheap_passes_verify_the_whole_tree_and_dear_passes_cut_it():
    flat = warm_drafter([1.0] * 64)
    whole = warm_drafter(None)
    assert len(flat.propose()) == len(whole.propose()) > 8
    offered, kept, expected = flat.last_selection
    assert kept == offered and expected > 0
    dear = warm_drafter([float(n) for n in range(1, 65)])  # every token costs a full pass
    tree = dear.propose()
    assert len(tree) <= 3
    assert whole.last_selection is None  # off unless a cost curve is set


def test_observed_rejections_shrink_later_trees():
    d = warm_drafter([1.0 + 0.05 * n for n in range(64)])
    first = len(d.propose())
    for _ in range(40):  # the target never agrees with a draft: only the bonus is committed
        t = d.propose()
        # A bonus no node of this tree drafts (a repeated one would be learned and drafted).
        bonus = next(x for x in range(V - 1, 0, -1) if x not in set(t.tokens.tolist()))
        pred = np.full(len(t), bonus, dtype=np.int64)
        ids = np.tile(np.arange(V - 8, V, dtype=np.int64)[::-1], (len(t), 1))
        d.observe(pred, ids, np.full((len(t), 8), 0.1, dtype=np.float32))
    sizes = [len(d.propose()) for _ in range(1)]
    assert sizes[0] < first
    assert any(row[3] > 0 for row in d.calibration())


@pytest.mark.parametrize("cost, fragment", [([], "non-empty"), ([0.1, float("nan")], "finite"),
                                            ([0.0], "> 0")])
def test_bad_cost_curves_are_rejected(cost, fragment):
    with pytest.raises(ValueError, match=fragment):
        warm_drafter(cost)


def test_bad_budget_settings_are_rejected():
    with pytest.raises(ValueError, match='budget: expected an int or "auto"'):
        RecapConfig(budget="fast")
    with pytest.raises(ValueError, match="max_budget"):
        RecapConfig(max_budget=-1)


def test_auto_decoder_calibrates_once_reports_and_equals_greedy():
    model = text_model("Qwen2")
    dec = recap.Decoder(model)  # budget="auto" is the default
    # First use measures the small trees only (bigger ones join the curve online).
    assert dec.cost is not None and dec.cost.points == list(recap.first_use.budget.POINTS)
    again = recap.Decoder(model)
    assert again.cost is dec.cost  # cached per model, device, dtype and threads
    ids = torch.tensor([[7, 8, 9, 10, 7, 8, 9, 10, 7, 8]])
    want = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=30,
                          eos_token_id=None, pad_token_id=0)
    assert dec.generate(ids, max_new_tokens=30, eos_token_id=None).tolist() == want.tolist()
    s = dec.last_stats.as_dict()
    assert s["cost"]["observed_steps"] >= dec.last_stats.steps
    assert s["offered_nodes"] >= sum(dec.last_stats.tree_sizes) - dec.last_stats.steps
    # The prompt repeats: the controller expects some of what it verifies to be accepted, never
    # more nodes than it kept.
    kept = sum(dec.last_stats.tree_sizes) - dec.last_stats.steps
    assert 0.0 < s["predicted_accepted"] <= kept
    assert recap.Decoder(model, RecapConfig(budget=8)).cost is None  # a fixed budget: no calibration


def test_calibrate_measures_but_leaves_fixed_budgets_and_peers_their_own_trees():
    """`calibrate()` returns the curve; a decoder whose trees are not sized to the hardware
    (an int budget, a peer such as SAM) still verifies its trees as drafted, uncut."""
    model = text_model("Qwen2")
    ids = torch.tensor([[7, 8, 9, 10, 7, 8, 9, 10, 7, 8]])
    for drafter, config in [("recap", RecapConfig(budget=8)), ("sam", RecapConfig())]:
        sizes = []
        for calibrated in (False, True):
            dec = recap.Decoder(model, config, drafter=drafter)
            if calibrated:
                curve = dec.calibrate()  # measured up to the drafter's largest tree
                assert curve.points[:3] == [1, 2, 4] and len(curve.seconds) == len(curve.points) >= 4
            dec.generate(ids, max_new_tokens=40, eos_token_id=None)
            assert dec.last_stats.predicted_accepted == 0.0, drafter  # no controller ranked them
            sizes.append(dec.last_stats.tree_sizes)
        assert sizes[0] == sizes[1] and max(sizes[1]) > 1, (drafter, sizes)


def test_cost_curves_belong_to_their_model_and_layout():
    import copy
    import gc
    import weakref

    from recap.state.model_state import peek

    model = copy.deepcopy(text_model("Qwen2"))  # a model of its own, so it can be collected
    default = recap.Decoder(model, linear_layout="default")
    transposed = recap.Decoder(model, linear_layout="transposed")
    assert default.cost is not transposed.cost  # timed in different layouts
    assert recap.Decoder(model, linear_layout="transposed").cost is transposed.cost
    other = copy.deepcopy(model)  # same shapes, device, dtype and threads: still its own curve
    assert recap.Decoder(other, linear_layout="default").cost is not default.cost
    curves = list(peek(model).cost_curves.values())
    assert len(curves) == 2  # one per layout
    gone = weakref.ref(model)
    del model, default, transposed
    gc.collect()
    assert gone() is None  # what recap keeps with a model does not keep it alive
    theirs = list(peek(other).cost_curves.values())
    assert theirs and not any(c is mine for c in theirs for mine in curves)


def test_suffix_chain_adapts_only_with_the_automatic_budget():
    assert RecapConfig().adaptive_suffix and RecapConfig().suffix_tokens == recap_defaults()["auto_suffix_cap"] == 64
    assert not RecapConfig(budget=16).adaptive_suffix and RecapConfig(budget=16).suffix_tokens == 4
    assert RecapConfig(budget=16, suffix_len=7).suffix_tokens == 7
    history = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5], dtype=np.int64)
    chains = {}
    for budget in ("auto", 0):
        d = RecapConfig(budget=budget, max_budget=0).new_drafter(V).session()
        d.begin(history)
        chains[budget] = len(d.propose()) - 1
    assert chains[0] == 4 and chains["auto"] == 10  # match of 5: all of 6..10, 1..5 (< 16)


def test_first_use_prices_each_size_by_the_median_of_warm_passes_and_the_probes_own(monkeypatch):
    import copy

    from recap.first_use import budget, layout_choice
    from recap.first_use.budget import ChainPasses
    from recap.verify import linear_layout

    model = copy.deepcopy(text_model("Qwen2"))  # nothing measured on it yet
    runs: list[tuple[int, str, float]] = []  # size, the product it ran, seconds
    real = ChainPasses.run

    def run(self, tokens):
        t = real(self, tokens)
        n = tokens.shape[1]
        runs.append((n, linear_layout.layout_of(model).plan.product(n), t))
        return t

    monkeypatch.setattr(ChainPasses, "run", run)
    dec = recap.Decoder(model, linear_layout="auto")
    cost = dec.cost
    plan = linear_layout.Plan.named(dec.linear_layout_used)

    def probe(size):
        return [t for n, product, t in runs if n == size and product == plan.product(size)]

    assert layout_choice.PROBE_TOKENS == (1, 2, 4, 16) and budget.POINTS == (1, 2, 4, 8, 12, 16)
    points = list(budget.POINTS)
    probed = [n for n in points if n in layout_choice.PROBE_TOKENS]
    fresh = [n for n in points if n not in probed]
    # The curve's own passes come last: one untimed pass of each size the probe did not run,
    # then interleaved rounds, REPS of each fresh size and REPS - 1 of each probed one (the
    # probe's pass is one sample and stands for the untimed first pass of the shape), all in
    # the chosen plan's products.
    order = fresh + points * (budget.REPS - 1) + fresh
    own = runs[-len(order):]
    probe_runs = runs[:-len(own)]
    assert [n for n, _, _ in own] == order
    assert all(product == plan.product(n) for n, product, _ in own)
    timed = own[len(fresh):]
    # Each point: the median of its timed passes (and for a probed size the probe's fastest
    # pass at that size in the plan's product), made non-decreasing as every curve is (on a
    # tiny model a 16-token pass can time below a 4-token one).
    want = [float(np.median([t for m, _, t in timed if m == n]
                            + [min(t for m, product, t in probe_runs if m == n and product == plan.product(n))
                               for _ in range(n in probed)]))
            for n in points]
    assert cost.points == points and cost.seconds == budget._monotone(np.asarray(want)).tolist()
    assert cost.passes == (budget.REPS,) * len(points) and cost.confirmed_by == 0
    # The probe ran every size in the model's own products and in the trial plan's (one or
    # two rounds; no warm-up, since the conformance probe had just run the model); the
    # transposed copy's first pass was one untimed token.
    sizes = [n for n, _, _ in probe_runs]
    assert sizes.count(2) == sizes.count(4) == sizes.count(16) in (2, 4) and sizes.count(1) in (3, 5)
    assert [product for n, product, _ in probe_runs if n == 1][1] == "copy"  # the copy's warm-up


def _state(points, ms, ratio, seen, steps=100, overall=1.0):
    return {"points": points, "ms": ms, "online_ratio": ratio, "seen": seen, "global_ratio": overall,
            "observed_steps": steps, "host_ms": 0.1}


def test_a_kept_curve_that_decoding_shows_wrong_is_replaced_here_and_in_the_store(tmp_path, monkeypatch):
    import copy

    from recap.first_use import budget
    from recap.state import measurements
    from recap.state.model_state import state_of

    monkeypatch.setenv("RECAP_CACHE", "1")
    monkeypatch.setenv("RECAP_CACHE_DIR", str(tmp_path))
    model = copy.deepcopy(text_model("Llama"))
    key = budget.model_key(model) + ("default",)
    # Kept from an earlier process (confirmed then), but c(1) was taken while the machine was busy.
    kept = budget.CostModel([1, 4, 12], [0.100, 0.020, 0.030], confirmed_by=100, passes=(9, 9, 9))
    state_of(model).cost_curves[key] = kept
    # Too few steps, or every point within HEAL_OFF of the kept curve: left alone.
    few = _state([1, 4, 12], [100, 20, 30], [0.2, 1, 1], [50, 0, 0], steps=10)
    assert budget.settle(model, ("default",), few) is None
    assert budget.settle(model, ("default",), _state([1, 4, 12], [100, 20, 30], [1.1, 0.9, 1.2], [50, 9, 9])) is None
    assert budget.settle(model, ("default",), None) is None
    assert state_of(model).cost_curves[key] is kept
    # Point 1 really costs 15 ms (50 passes say so); 4 was seen too little to judge; the curve
    # grew online to 24 (well seen) and 40 (seen once: left out).
    healed = budget.settle(model, ("default",), _state([1, 4, 12, 24, 40], [100, 20, 30, 44, 60],
                                                     [0.15, 0.5, 1.1, 1.0, 1.0], [50, 2, 9, 12, 1], overall=1.2))
    assert healed is not None and healed.points == [1, 4, 12, 24]
    assert healed.seconds == pytest.approx([0.015, 0.024, 0.033, 0.044])  # 4: the global correction
    assert state_of(model).cost_curves[key] is healed
    stored = measurements.load(measurements.key(model, "cost", ("default",)))
    assert stored == {"points": healed.points, "seconds": healed.seconds,  # what the next process loads
                      "confirmed_by": 100, "passes": [50, 100, 9, 12]}  # 4: backed by every step
    # The healed curve is what later requests are judged against: the same state is now right.
    assert budget.settle(model, ("default",), _state([1, 4, 12, 24], [100, 20, 30, 44], [0.15, 1.2, 1.1, 1.0],
                                                   [60, 2, 10, 13], overall=1.2)) is None


def test_a_first_use_curve_is_stored_only_once_decoding_confirms_it(tmp_path, monkeypatch):
    import copy

    from recap.first_use import budget
    from recap.state import measurements
    from recap.state.model_state import state_of

    monkeypatch.setenv("RECAP_CACHE", "1")
    monkeypatch.setenv("RECAP_CACHE_DIR", str(tmp_path))
    model = copy.deepcopy(text_model("Llama"))
    key = budget.model_key(model) + ("default",)
    stored_as = measurements.key(model, "cost", ("default",))
    measured = budget.CostModel([1, 2, 4, 16], [0.010, 0.010, 0.011, 0.014], passes=(4, 4, 4, 4))
    state_of(model).cost_curves[key] = measured
    agrees = _state([1, 2, 4, 16], [10, 10, 11, 14], [1.05, 1.0, 0.95, 1.1], [40, 30, 9, 0], steps=70)
    assert budget.settle(model, ("default",), dict(agrees, observed_steps=20)) is None  # too few steps
    assert measurements.load(stored_as) is None
    confirmed = budget.settle(model, ("default",), agrees)
    assert confirmed is not None and confirmed.seconds == measured.seconds and confirmed.confirmed_by == 70
    assert measurements.load(stored_as) == {"points": [1, 2, 4, 16], "seconds": measured.seconds,
                                            "confirmed_by": 70, "passes": [4, 4, 4, 4]}
    assert budget.settle(model, ("default",), agrees) is None  # confirmed already: nothing to write
    # A stored entry without confirmation (an older store, or a hand-written one) is not read.
    for entry in ({"points": [1, 4], "seconds": [0.5, 0.6]},
                  {"points": [1, 4], "seconds": [0.5, 0.6], "confirmed_by": 3},
                  {"points": [1, 4], "seconds": [0.5, -1.0], "confirmed_by": 99}):
        assert budget._confirmed(entry) is None
    assert budget._confirmed(measurements.load(stored_as)) == confirmed


def test_decoding_replaces_a_wrong_stored_curve_for_the_next_process(tmp_path, monkeypatch):
    import copy

    from recap.first_use import budget
    from recap.state import measurements
    from recap.state.model_state import state_of

    monkeypatch.setenv("RECAP_CACHE", "1")
    monkeypatch.setenv("RECAP_CACHE_DIR", str(tmp_path))
    model = copy.deepcopy(text_model("Qwen2"))
    stored_as = measurements.key(model, "cost", ("default",))
    measurements.store(stored_as, {"points": [1, 4, 16], "seconds": [5.0, 6.0, 7.0],  # seconds, not ms
                                   "confirmed_by": budget.HEAL_AFTER, "passes": [64, 64, 64]})
    prompt = torch.tensor([[5, 9, 14, 21, 7, 33, 5, 9, 14, 21]])
    want = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=120,
                          min_new_tokens=120, do_sample=False)
    dec = recap.Decoder(model, linear_layout="default")
    assert dec.cost.seconds == [5.0, 6.0, 7.0]  # an earlier process's curve is trusted at first
    for _ in range(3):  # the online curve carries over between requests: its steps add up
        got = dec.generate(prompt, max_new_tokens=120, min_new_tokens=120)
        assert torch.equal(got, want)  # only the tree sizes ever depend on the curve
        if dec.last_stats.cost["observed_steps"] < budget.HEAL_AFTER:
            assert dec.cost.seconds == [5.0, 6.0, 7.0]  # not judged on a few steps
    assert dec.last_stats.cost["observed_steps"] >= budget.HEAL_AFTER
    real = dec.last_stats.cost
    assert dec.cost.seconds[0] < 0.5 and dec.cost.points[:3] == [1, 4, 16]
    # What the controller prices a one-token pass at now (within what heals again), through
    # the curve's monotone envelope, as heal stores it: a one-token pass that timing noise
    # made dearer than a bigger pass takes the bigger pass's time.
    priced = [t / 1e3 * (r if n >= budget.HEAL_SEEN else real["global_ratio"])
              for p, t, r, n in zip(real["points"], real["ms"], real["online_ratio"], real["seen"], strict=True)
              if n >= budget.HEAL_SEEN or p in dec.cost.points]
    assert dec.cost.seconds[0] == pytest.approx(min(priced), rel=budget.HEAL_OFF)
    assert measurements.load(stored_as)["seconds"] == dec.cost.seconds and dec.cost.confirmed_by >= budget.HEAL_AFTER
    state_of(model).__init__()  # a later process on the same model
    assert recap.Decoder(model, linear_layout="default").cost.seconds == dec.cost.seconds
