"""The native drafter API: behaviour, invariants and bad input."""

import threading

import numpy as np
import pytest
import recap
from hypothesis import given, settings
from hypothesis import strategies as st
from recap import Drafter, PersistentMemory, RecapConfig
from recap._core import recap_defaults

V = 50


def rows(n, k=8, seed=0, vocab=V):
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(n)]).astype(np.int64)
    p = np.sort(rng.random((n, k)).astype(np.float32), axis=1)[:, ::-1] / k
    return ids, np.ascontiguousarray(p)


def naive_accept(tokens, parents, pred):
    """Deepest root path whose tokens equal the parent's prediction (earliest on ties)."""
    ok = {0: 1}
    best = 0
    for i in range(1, len(tokens)):
        p = parents[i]
        if p in ok and tokens[i] == pred[p]:
            ok[i] = ok[p] + 1
            if ok[i] > ok[best]:
                best = i
    path = [best]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1], pred[best]


def test_version_and_public_names():
    assert isinstance(recap.__version__, str) and recap.__version__.count(".") == 2
    assert {"Decoder", "Drafter", "PersistentMemory", "RecapConfig"} <= set(recap.__all__)


def test_first_tree_grafts_the_suffix_continuation():
    d = RecapConfig().new_drafter(V).session()
    d.begin(np.array([1, 2, 3, 4, 1, 2], dtype=np.int64))
    t = d.propose()
    # Nothing learned yet: only the continuation of the earlier "1 2" (3 4 1 2) is drafted.
    assert t.tokens.tolist() == [2, 3, 4, 1, 2]
    assert t.parents.tolist() == [-1, 0, 1, 2, 3]
    # Copied (2); after this short match the frequency tree's first two are its price (4).
    assert t.sources.tolist() == [0, 4, 4, 2, 2]
    assert t.mask.dtype == np.bool_ and t.mask.shape == (5, 5)
    assert np.array_equal(t.mask, np.tril(np.ones((5, 5), dtype=bool)))


def test_observe_commits_the_accepted_path_and_bonus_and_learns():
    d = RecapConfig(budget=8).new_drafter(V).session()
    d.begin([5, 6, 7])
    t = d.propose()
    assert len(t) == 1  # empty memories, no repeat: the root alone (a plain decoding step)
    ids = np.array([[9, 8, 7, 6, 5, 4, 3, 2]], dtype=np.int64)
    probs = np.array([[0.5, 0.2, 0.1, 0.05, 0.05, 0.04, 0.03, 0.03]], dtype=np.float32)
    path, committed = d.observe(np.array([9]), ids, probs)
    assert path.tolist() == [0] and committed.tolist() == [9]
    assert d.history.tolist() == [5, 6, 7, 9]
    # Token 7 now has a row in U: after another 7 the tree proposes its recorded top-k.
    stored = d.memory.row(7)
    assert stored[0].tolist() == ids[0].tolist()
    d.begin([1, 7])
    t = d.propose()
    assert t.tokens[0] == 7 and set(t.tokens[1:].tolist()) <= set(ids[0].tolist())
    assert t.tokens[1] == 9  # the most probable child is first in preorder


@settings(max_examples=40, deadline=None)
@given(
    prompt=st.lists(st.integers(0, V - 1), min_size=1, max_size=30),
    steps=st.integers(1, 12),
    budget=st.integers(0, 20),
    depth=st.integers(1, 6),
    fusion=st.sampled_from(["unigram", "backoff", "uniform", "prior", "prior_confidence"]),
    seed=st.integers(0, 1000),
)
def test_propose_observe_invariants(prompt, steps, budget, depth, fusion, seed):
    rng = np.random.default_rng(seed)
    d = RecapConfig(budget=budget, max_depth=depth, fusion=fusion, suffix_len=4).new_drafter(V).session()
    d.begin(prompt)
    history = list(prompt)
    for step in range(steps):
        t = d.propose()
        n = len(t)
        tokens, parents, depths = t.tokens, t.parents, t.depths
        assert tokens[0] == history[-1] and parents[0] == -1 and depths[0] == 0
        assert n <= 1 + budget + 4
        assert depths.max() <= depth
        for i in range(1, n):
            assert 0 <= parents[i] < i and depths[i] == depths[parents[i]] + 1
        # Predictions: mostly follow the draft's first child so paths get accepted.
        pred = rng.integers(0, V, size=n)
        for i in range(n):
            kids = [j for j in range(n) if parents[j] == i]
            if kids and rng.random() < 0.7:
                pred[i] = tokens[kids[0]]
        ids, probs = rows(n, seed=seed + step)
        ids[:, 0] = pred
        path, committed = d.observe(pred, ids, probs)
        want_path, bonus = naive_accept(tokens.tolist(), parents.tolist(), pred.tolist())
        assert path.tolist() == want_path
        assert committed.tolist() == [int(tokens[j]) for j in want_path[1:]] + [int(bonus)]
        history += committed.tolist()
        assert d.history.tolist() == history


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"k": 0}, "k: expected 1..=64, got 0"),
        ({"k": 65}, "k: expected 1..=64, got 65"),
        ({"budget": -1}, "budget: expected a value >= 0, got -1"),
        ({"budget": 5000}, "budget: expected 0..=4096, got 5000"),
        ({"max_depth": 0}, "max_depth"),
        ({"fusion": "mean"}, "fusion: expected one of"),
        ({"eta": [0.5, 2.0]}, "eta"),
        ({"priors": (0.0, 0.0, 0.0)}, "priors"),
        ({"excluded": [V + 3]}, f"token id {V + 3} is outside the vocabulary"),
    ],
)
def test_bad_configuration_raises_value_error(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(".", r"\.")):
        Drafter.recap(V, **kwargs)


def test_config_dataclass_validates_through_the_core():
    with pytest.raises(ValueError, match="budget: expected a value >= 0, got -3"):
        RecapConfig(budget=-3)
    with pytest.raises(ValueError, match="fusion"):
        RecapConfig(fusion="max")
    with pytest.raises(ValueError, match="max_budget: expected 0..=4096, got 5000"):
        RecapConfig(max_budget=5000)
    with pytest.raises(ValueError, match="budget: expected an int or \"auto\", got 'fast'"):
        RecapConfig(budget="fast")


def test_configuration_has_one_source_of_truth():
    """The dataclass's defaults are the core's, and a drafter built from RecapConfig() drafts
    exactly what the core's own defaults draft."""
    d = recap_defaults()
    c = RecapConfig(budget=d["max_budget"])
    assert (c.k, c.max_budget, c.max_depth, c.fusion, c.context_capacity, c.memory_capacity) == (
        d["k"], d["max_budget"], d["max_depth"], d["fusion"], d["context_capacity"], d["memory_capacity"])
    assert c.eta == pytest.approx(tuple(d["eta"])) and c.priors == pytest.approx(tuple(d["priors"]))
    assert c.suffix_tokens == d["suffix_len"] and RecapConfig().suffix_tokens == d["auto_suffix_cap"]
    history = np.array([3, 5, 7, 3, 5, 9, 3, 5, 7, 11, 3, 5], dtype=np.int64)
    rng = np.random.default_rng(0)
    ids = np.argsort(-rng.random((len(history), V)), axis=1)[:, :8].astype(np.int64)
    probs = np.sort(rng.random((len(history), 8)).astype(np.float32), axis=1)[:, ::-1].copy()
    trees = []
    for drafter in (c.new_drafter(V).session(), Drafter.recap(V).session()):
        drafter.begin(history)
        drafter.seed(ids, probs)
        trees.append(drafter.propose())
    assert trees[0].tokens.tolist() == trees[1].tokens.tolist() and len(trees[0]) > 1


def test_bad_input_gets_clear_exceptions():
    d = Drafter.recap(V).session()
    with pytest.raises(RuntimeError, match="before begin"):
        d.propose()
    with pytest.raises(ValueError, match="at least one token"):
        d.begin(np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match=f"token id 99 is outside the vocabulary \\(expected 0 <= id < {V}\\)"):
        d.begin([1, 99])
    with pytest.raises(ValueError, match="must be >= 0"):
        d.begin([1, -4])
    with pytest.raises(TypeError, match="expected a 1-D integer array.*float32"):
        d.begin(np.array([1.0, 2.0], dtype=np.float32))
    with pytest.raises(TypeError, match="expected a 1-D integer array"):
        d.begin(np.zeros((2, 2), dtype=np.int64))
    d.begin([1, 2, 3])
    with pytest.raises(ValueError, match="limit_new_tokens: expected a token count >= 0, got -2"):
        d.limit_new_tokens(-2)
    with pytest.raises(RuntimeError, match="without a proposed tree"):
        d.observe([1], *rows(1))
    t = d.propose()
    n = len(t)
    with pytest.raises(ValueError, match=f"expected shape {n} predictions"):
        d.observe(np.zeros(n + 1, dtype=np.int64), *rows(n + 1))
    ids, probs = rows(n)
    with pytest.raises(TypeError, match="float32 or float64"):
        d.observe(np.zeros(n, dtype=np.int64), ids, probs.astype(np.int64))
    with pytest.raises(ValueError, match="expected the shape of topk_ids"):
        d.observe(np.zeros(n, dtype=np.int64), ids, probs[:, :4])
    bad = ids.copy()
    bad[0, 0] = V
    with pytest.raises(ValueError, match="outside the vocabulary"):
        d.observe(np.zeros(n, dtype=np.int64), bad, probs)
    nan = probs.copy()
    nan[0, 0] = np.nan
    with pytest.raises(ValueError, match="finite probabilities"):
        d.observe(np.zeros(n, dtype=np.int64), ids, nan)
    # A failed observe leaves the tree pending; a correct one still goes through.
    path, committed = d.observe(np.zeros(n, dtype=np.int64), ids, probs)
    assert committed.tolist()[-1] == 0
    with pytest.raises(ValueError, match="at most 4 rows"):
        d.seed(*rows(9))


def test_memory_is_shared_bounded_and_reports_bytes():
    mem = PersistentMemory(V, k=8, capacity=16)
    a = RecapConfig().new_drafter(V, memory=mem).session()
    b = RecapConfig().new_drafter(V, memory=mem).session()
    a.begin(list(range(30)))
    a.seed(*rows(30))
    assert len(mem) == 16 and mem.evictions == 14
    b.begin([29])
    assert len(b.propose()) > 1  # b sees what a seeded
    assert mem.bytes() > 16 * 8 * 8
    with pytest.raises(ValueError, match="vocab_size"):
        Drafter.recap(V + 1, memory=mem)
    with pytest.raises(ValueError, match="k 4, got vocab_size 50 and k 8"):
        Drafter.recap(V, k=4, memory=mem)


def test_separate_drafters_run_concurrently_from_threads():
    mem = PersistentMemory(V)
    errors = []

    def work(seed):
        try:
            d = RecapConfig(budget=16).new_drafter(V, memory=mem).session()
            d.begin(list(range(seed, seed + 10)))
            for step in range(200):
                t = d.propose()
                n = len(t)
                ids, probs = rows(n, seed=seed * 1000 + step)
                d.observe(ids[:, 0], ids, probs)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert len(mem) > 0
