"""The native boundary under random call sequences: every call into `recap._core` and the
memory pool either works or raises one of the documented exceptions (ValueError, TypeError,
OverflowError, RuntimeError, KeyError); a Rust panic (pyo3's PanicException, a BaseException)
or an abort fails the run.

RECAP_FUZZ_EXAMPLES sets the number of examples (the test command runs a short version)."""

import os
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from recap import Drafter, MemoryPool, PersistentMemory

DOCUMENTED = (ValueError, TypeError, OverflowError, RuntimeError, KeyError)
EXAMPLES = int(os.environ.get("RECAP_FUZZ_EXAMPLES", "40"))
KINDS = ["recap", "recap_auto", "tr", "sam", "sam_tr", "pld", "suffix", "suffix_x", "ar"]

ints = st.integers(-5, 400)
shapes = st.tuples(st.integers(0, 12), st.integers(0, 10))
dtypes = st.sampled_from([np.int64, np.int32, np.float32, np.float64, np.uint8])
FLOATS = [0.0, 0.1, 0.5, 1.0, 2.0, -0.1, float("nan"), float("inf"), -float("inf")]
floats = st.sampled_from(FLOATS)


DONE = object()  # a call that returned None and did not raise


def call(fn, *args, **kwargs):
    """The call's result (DONE for None), or None when it raised a documented exception."""
    try:
        result = fn(*args, **kwargs)
    except DOCUMENTED:
        return None
    return DONE if result is None else result


def array(draw_values, shape, dtype):
    a = np.asarray(draw_values, dtype=np.float64)
    need = int(np.prod(shape)) if shape else 1
    a = np.resize(a if a.size else np.zeros(1), need).reshape(shape)
    with np.errstate(invalid="ignore", over="ignore"):
        return a.astype(dtype) if dtype not in (np.int64, np.int32, np.uint8) else np.nan_to_num(a).astype(dtype)


class CoreMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="recap-fuzz-"))
        self.drafter = None
        self.memory = None
        self.tree_len = 0  # nodes of the last tree proposed (0: none awaits verification)
        self.context_len = 0  # tokens the last successful begin gave
        self.vocab, self.k = 1, 1
        self.pool = MemoryPool(1 << 16, rows_per_scope=64)

    def teardown(self):
        shutil.rmtree(self.dir, ignore_errors=True)  # each run's saved memories, not left in /tmp

    @initialize(vocab=st.integers(-2, 300), k=st.integers(-1, 9), kind=st.sampled_from(KINDS),
                budget=st.integers(-1, 40), capacity=st.integers(-1, 64))
    def build(self, vocab, k, kind, budget, capacity):
        self.vocab, self.k = vocab, k
        self.memory = call(PersistentMemory, vocab, k=k, capacity=capacity)
        makers = {
            "recap": lambda: Drafter.recap(vocab, k=k, budget=budget, memory=self.memory),
            "recap_auto": lambda: Drafter.recap(vocab, k=k, budget=budget, suffix_len=64, suffix_adaptive=True),
            "tr": lambda: Drafter.tr(vocab, k=k, memory=self.memory),
            "sam": lambda: Drafter.sam(vocab, max_len=budget),
            "sam_tr": lambda: Drafter.sam(vocab, fallback_tr=True, k=k, memory=self.memory),
            "pld": lambda: Drafter.pld(vocab, num_tokens=budget),
            "suffix": lambda: Drafter.suffix(vocab),
            "suffix_x": lambda: Drafter.suffix(vocab, cross_request=True),
            "ar": lambda: Drafter.ar(vocab),
        }
        self.drafter = call(makers[kind])
        # Every stream of drafts is a session; the drafter itself holds what sessions share.
        self.stream = None if self.drafter is None else self.drafter.session()

    @rule(values=st.lists(ints, max_size=30), dtype=dtypes)
    def begin(self, values, dtype):
        if self.drafter is not None and call(self.stream.begin, array(values, (len(values),), dtype)):
            self.context_len, self.tree_len = len(values), 0

    @rule(shape=shapes, ids=st.lists(ints, max_size=20), probs=st.lists(floats, max_size=20), dtype=dtypes,
          fit=st.booleans())
    def seed(self, shape, ids, probs, dtype, fit):
        """Random rows, or (fit) one row per context token with in-range ids."""
        if self.drafter is None:
            return
        if fit and self.k >= 1 and self.vocab >= 1:
            shape, dtype = (self.context_len, self.k), np.int64
            ids = [abs(i) % self.vocab for i in ids]
        call(self.stream.seed, array(ids, shape, dtype), array(probs, shape, np.float32))

    @rule()
    def propose(self):
        if self.drafter is not None:
            tree = call(self.stream.propose)
            if tree is not None:
                assert len(tree) == len(tree.tokens) >= 1
                self.tree_len = len(tree)

    @rule(size=st.integers(0, 80), masked=floats)
    def propose_into(self, size, masked):
        if self.drafter is not None:
            bufs = [np.zeros(size, np.int64) for _ in range(4)]
            got = call(self.stream.propose_into, *bufs, np.zeros(size * size, np.float32), masked, size)
            if got is not None:
                n, deepest = got
                assert 1 <= n <= size and 0 <= deepest < n
                self.tree_len = n

    @rule(rows=st.integers(0, 12), pred=st.lists(ints, max_size=12), probs=st.lists(floats, max_size=20),
          width=st.integers(0, 10), dtype=dtypes)
    def observe(self, rows, pred, probs, width, dtype):
        if self.drafter is not None:
            call(self.stream.observe, array(pred, (rows,), dtype), array(pred, (rows, width), dtype),
                 array(probs, (rows, width), np.float32))

    @rule(rows=st.integers(0, 12), values=st.lists(st.one_of(ints.map(float), floats), max_size=40),
          width=st.integers(0, 20), k=st.integers(-1, 9), timing=st.one_of(st.none(), floats),
          fit=st.booleans(), dtype=st.sampled_from([np.float32, np.float64]))
    def observe_packed(self, rows, values, width, k, timing, fit, dtype):
        """Random arrays, or (fit) the shape the last tree needs with random contents."""
        if self.drafter is None:
            return
        if fit and self.tree_len and self.k >= 1:
            rows, width, k = self.tree_len, 1 + 2 * self.k, self.k
            values = [float(int(abs(v)) % max(self.vocab, 1)) if np.isfinite(v) else v for v in map(float, values)]
        if call(self.stream.observe_packed, array(values, (rows, width), dtype), k, timing, timing) is not None:
            self.tree_len = 0

    @rule(values=st.lists(st.integers(0, 10_000), min_size=1, max_size=40), bad=st.sampled_from([None, *FLOATS]),
          timing=st.one_of(st.none(), st.floats(1e-4, 0.1)), use_buffers=st.booleans(), fresh=st.booleans())
    def step(self, values, bad, timing, use_buffers, fresh):
        """A well-formed step (propose, then the packed verifier output of that tree), with
        sometimes one bad probability in it; `fresh` starts a request first."""
        if self.drafter is None or self.k < 1 or self.vocab < 1:
            return
        if fresh:
            # In-vocabulary tokens: a fresh request must start, and its first step must work.
            assert call(self.stream.begin, np.asarray(values, dtype=np.int64) % self.vocab) is DONE
            self.context_len = len(values)
        if use_buffers:
            t = self.drafter.max_nodes + 1
            got = call(self.stream.propose_into, *(np.zeros(t, np.int64) for _ in range(4)),
                       np.zeros(t * t, np.float32), -1.0)
            n = got[0] if isinstance(got, tuple) else None
        else:
            tree = call(self.stream.propose)
            n = len(tree) if tree is not None else None
        if fresh:
            assert n is not None and n >= 1
        if n is None:
            return
        k = self.k
        ids = np.resize(np.asarray(values) % self.vocab, (n, 1 + k)).astype(np.float32)
        probs = np.resize(np.linspace(0.9, 0.01, k, dtype=np.float32), (n, k))
        if bad is not None:
            probs[n // 2, k // 2] = bad
        got = call(self.stream.observe_packed, np.concatenate([ids, probs], axis=1), k, timing, timing)
        if bad is None or (np.isfinite(bad) and bad >= 0):
            path, committed = got  # a well-formed verification must be accepted
            assert path[0] == 0 and len(committed) == len(path) >= 1
        else:
            assert got is None  # a NaN, infinite or negative probability must be refused
        self.tree_len = 0

    @rule(points=st.lists(st.integers(-2, 130), max_size=6), seconds=st.lists(floats, max_size=6))
    def set_cost(self, points, seconds):
        if self.drafter is not None:
            call(self.drafter.set_cost_points, points, seconds)
            call(self.drafter.set_cost, [abs(s) + 1e-3 if np.isfinite(s) else s for s in seconds] or None)
            self.stream = self.drafter.session()  # the curve applies to sessions opened from now on
            self.context_len, self.tree_len = 0, 0

    @rule(vocab=st.integers(-1, 300), k=st.integers(-1, 9), fit=st.booleans())
    def session_in_another_memory(self, vocab, k, fit):
        """A session opened on another memory (a scope's): one that fits opens on a drafter
        that keeps rows, anything else raises ValueError."""
        if self.drafter is None:
            return
        vocab, k = (self.vocab, self.k) if fit else (vocab, k)
        other = call(PersistentMemory, vocab, k=k, capacity=32)
        if other is None:
            return
        keeps_rows = self.drafter.memory is not None
        fits = keeps_rows and (vocab, k) == (self.drafter.memory.vocab_size, self.drafter.memory.k)
        try:
            session = self.drafter.session(memory=other)
        except ValueError:
            assert not fits
            return
        assert fits
        assert session.memory is other

    @rule(damage=st.sampled_from(["none", "truncate", "flip", "version", "junk"]), at=st.integers(0, 10_000),
          expect_vocab=st.one_of(st.none(), st.integers(0, 300)), expect_k=st.one_of(st.none(), st.integers(0, 9)))
    def snapshot(self, damage, at, expect_vocab, expect_k):
        if self.memory is None:
            return
        path = self.dir / "m.recapmem"
        call(self.memory.save, str(path), fingerprint=at)
        if not path.exists():
            return
        data = bytearray(path.read_bytes())
        if damage == "truncate":
            data = data[: at % (len(data) + 1)]
        elif damage == "flip" and data:
            data[at % len(data)] ^= 1 << (at % 8)
        elif damage == "version":
            data[8:12] = (at % 5).to_bytes(4, "little")
        elif damage == "junk":
            data = bytearray(os.urandom(at % 200))
        path.write_bytes(bytes(data))
        loaded = call(PersistentMemory.load, str(path), vocab_size=expect_vocab, k=expect_k)
        if loaded is not None and damage == "none":
            assert len(loaded) == len(self.memory)

    @rule(scope=st.sampled_from(["a", "b", "", "c"]), vocab=st.integers(1, 300), k=st.integers(1, 8))
    def pool_scope(self, scope, vocab, k):
        try:
            with self.pool.use(scope, vocab, k) as memory:
                d = Drafter.recap(vocab, k=k, budget=4, memory=memory).session()
                d.begin(np.arange(min(vocab, 6), dtype=np.int64))
                d.seed(np.zeros((min(vocab, 6), k), np.int64), np.full((min(vocab, 6), k), 0.5, np.float32))
        except DOCUMENTED:
            pass

    @rule(values=st.lists(ints, min_size=1, max_size=20))
    def share_with_a_thread(self, values):
        """Another thread drafts on the same memory while this one proposes."""
        if self.memory is None or self.vocab < 1 or self.k < 1:
            return
        other = Drafter.recap(self.vocab, k=self.k, budget=6, memory=self.memory).session()
        tokens = np.asarray([v % self.vocab for v in values], dtype=np.int64)
        errors = []

        def work():
            try:  # well-formed calls on the thread's own session: every one must work
                other.begin(tokens)
                for _ in range(3):
                    n = len(other.propose())
                    path, committed = other.observe(np.zeros(n, np.int64), np.zeros((n, self.k), np.int64),
                                                    np.full((n, self.k), 0.2, np.float32))
                    assert len(committed) == len(path) >= 1
                assert len(other.history) >= len(tokens) + 3
            except BaseException as e:  # noqa: BLE001 - reported on the main thread
                errors.append(repr(e))

        t = threading.Thread(target=work)
        t.start()
        if self.drafter is not None:
            call(self.stream.propose)
        t.join()
        assert not errors, errors

    @invariant()
    def memory_is_bounded(self):
        if self.memory is not None:
            assert len(self.memory) <= self.memory.capacity
        assert all(s["in_use"] == 0 for s in self.pool.stats().values())


TestCoreBoundary = CoreMachine.TestCase
TestCoreBoundary.settings = settings(max_examples=EXAMPLES, stateful_step_count=25, deadline=None,
                                     suppress_health_check=list(HealthCheck))
