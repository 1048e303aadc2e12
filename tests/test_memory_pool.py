"""Cross-request memory a service can trust: scopes isolate tenants (through the real
decoder, sequential and threaded), idle scopes are evicted whole under the byte bound, and
snapshots round-trip exactly and refuse every mismatched or damaged file."""

import threading

import numpy as np
import pytest
import recap
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recap import MemoryPool, PersistentMemory, RecapConfig
from tiny_models import V, text_model

MAX_NEW = 12


def prompt(seed: int, n: int = 10) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(3, V, (4,), generator=g)
    return torch.cat([base, base, torch.randint(3, V, (n - 8,), generator=g)]).unsqueeze(0)


def run(dec, scope, seed):
    out = dec.generate(prompt(seed), max_new_tokens=MAX_NEW, eos_token_id=None, memory_scope=scope)
    s = dec.last_stats
    return out.tolist(), list(s.tree_sizes), dict(s.accepted_lengths)


def new_decoder(pool, drafter="recap"):
    return recap.Decoder(text_model("Llama"), RecapConfig(budget=8), memory=pool, drafter=drafter)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(order=st.lists(st.tuples(st.sampled_from("AB"), st.integers(0, 5)), min_size=2, max_size=7),
       drafter=st.sampled_from(["recap", "tr", "sam_tr"]))
def test_a_scope_drafts_the_same_with_or_without_another_scopes_traffic(order, drafter):
    """For any interleaving of A's and B's requests, B's outputs and drafts (tree sizes and
    accepted lengths per request) equal those of B's requests run alone."""
    mixed = new_decoder(MemoryPool(1 << 30), drafter)
    alone = new_decoder(MemoryPool(1 << 30), drafter)
    seen_b = []
    for scope, seed in order:
        result = run(mixed, scope, seed)
        if scope == "B":
            seen_b.append(result)
    want_b = [run(alone, "B", seed) for scope, seed in order if scope == "B"]
    assert seen_b == want_b
    model = text_model("Llama")
    for (out, _, _), (_, seed) in zip(seen_b, [o for o in order if o[0] == "B"], strict=True):
        ref = model.generate(prompt(seed), attention_mask=torch.ones(1, 10, dtype=torch.long), do_sample=False,
                             max_new_tokens=MAX_NEW, eos_token_id=None)
        assert out == ref.tolist()


def test_scopes_stay_isolated_across_threads_sharing_a_pool():
    """Two threads, one decoder each, one pool: B's drafts are those of B alone, while A's
    requests run at the same time."""
    pool = MemoryPool(1 << 30)
    results, errors = {}, []
    barrier = threading.Barrier(2)

    def work(scope, seeds):
        try:
            dec = new_decoder(pool)
            barrier.wait()
            results[scope] = [run(dec, scope, s) for s in seeds]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=("A", [0, 1, 2, 3])),
               threading.Thread(target=work, args=("B", [4, 1, 4, 5]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    alone = new_decoder(MemoryPool(1 << 30))
    assert results["B"] == [run(alone, "B", s) for s in [4, 1, 4, 5]]
    assert set(pool.stats()) == {"A", "B"} and all(s["in_use"] == 0 for s in pool.stats().values())


def test_requests_without_a_scope_use_the_decoders_own_memory():
    pool = MemoryPool(1 << 30)
    dec = new_decoder(pool)
    run(dec, None, 0)
    assert len(dec.memory) > 0 and pool.stats() == {}
    run(dec, "A", 1)
    assert pool.stats()["A"]["rows"] > 0
    with pytest.raises(ValueError, match="expected a decoder built with memory=recap.MemoryPool"):
        run(new_decoder(None), "A", 0)
    with pytest.raises(ValueError, match="scopes do not cover"):
        run(new_decoder(pool, "suffix_x"), "A", 0)
    with pytest.raises(ValueError, match="memory_scope: expected a non-empty str"):
        run(dec, "", 0)


def test_idle_scopes_are_evicted_whole_least_recently_used_first():
    one = PersistentMemory(V, k=8)
    dec = new_decoder(MemoryPool(1 << 30))
    run(dec, "probe", 0)
    per_scope = dec.pool.stats()["probe"]["bytes"]
    assert per_scope > one.bytes()
    pool = MemoryPool(int(per_scope * 2.5))
    dec = new_decoder(pool)
    for scope in ["A", "B", "C"]:
        run(dec, scope, 0)
    assert set(pool.stats()) == {"B", "C"} and pool.evictions == 1  # A was the least recently used
    run(dec, "B", 1)
    run(dec, "D", 2)
    assert set(pool.stats()) == {"B", "D"}  # C went: B was used more recently
    assert pool.bytes() <= pool.max_bytes


def test_a_scope_in_use_is_never_evicted():
    pool = MemoryPool(0)
    with pool.use("busy", V, 8) as memory:
        tokens = np.arange(8, dtype=np.int64)
        d = RecapConfig(budget=4).new_drafter(V, memory=memory).session()
        d.begin(tokens)
        d.seed(np.tile(tokens, (8, 1)), np.full((8, 8), 0.1, dtype=np.float32))  # rows: it holds bytes
        with pool.use("other", V, 8):
            pass  # released: the pool is over its bound of 0 bytes, "other" goes, "busy" stays
        assert "busy" in pool and "other" not in pool
        with pytest.raises(RuntimeError, match="in use"):
            pool.drop("busy")
    assert "busy" not in pool  # evicted once released


def test_decoder_snapshots_round_trip_and_warm_start(tmp_path):
    dec = new_decoder(None)
    for seed in range(3):
        run(dec, None, seed)
    path = tmp_path / "u.recapmem"
    dec.save_memory(path)
    header = PersistentMemory.inspect(str(path))
    assert header["rows"] == len(dec.memory) and header["vocab_size"] == V and header["k"] == 8
    assert header["fingerprint"] == recap.memory_fingerprint(text_model("Llama"))
    warm = new_decoder(None)
    warm.load_memory(path)
    assert len(warm.memory) == len(dec.memory)
    for token in range(V):
        a, b = dec.memory.row(token), warm.memory.row(token)
        assert (a is None) == (b is None)
        if a is not None:
            assert a[0].tolist() == b[0].tolist() and np.array_equal(a[1], b[1])
    assert run(warm, None, 7) == run(dec, None, 7)  # the same memory drafts the same


def test_snapshots_refuse_other_models_and_damaged_files(tmp_path):
    dec = new_decoder(None)
    run(dec, None, 0)
    good = tmp_path / "u.recapmem"
    dec.save_memory(good)
    data = good.read_bytes()
    other = recap.Decoder(text_model("Qwen2"), RecapConfig(budget=8))
    with pytest.raises(ValueError, match="model fingerprint: expected"):
        other.load_memory(good)
    with pytest.raises(ValueError, match="K: expected 4, found 8"):
        PersistentMemory.load(str(good), k=4)
    cases = {
        "truncated": data[: len(data) // 2],
        "corrupted": data[:70] + bytes([data[70] ^ 1]) + data[71:],
        "version": data[:8] + (99).to_bytes(4, "little") + data[12:],
        "foreign": b"\x89PNG\r\n\x1a\n" + data[8:],
        "empty": b"",
    }
    messages = {"truncated": "truncated or corrupted", "corrupted": "checksum", "version": "format version: expected 1",
                "foreign": "not a recap memory snapshot", "empty": "truncated"}
    before = len(dec.memory)
    for name, content in cases.items():
        bad = tmp_path / f"{name}.recapmem"
        bad.write_bytes(content)
        with pytest.raises(ValueError, match=messages[name]):
            dec.load_memory(bad)
    assert len(dec.memory) == before  # nothing half-loaded
    with pytest.raises(ValueError, match="cannot read"):
        PersistentMemory.load(str(tmp_path / "missing.recapmem"))


def test_a_failed_save_leaves_the_old_snapshot_and_no_temporary_file(tmp_path):
    mem = PersistentMemory(V, k=8)
    target = tmp_path / "snap"
    target.mkdir()  # a directory where the file should go: the final rename fails
    with pytest.raises(ValueError, match="cannot replace"):
        mem.save(str(target))
    assert target.is_dir() and [p.name for p in tmp_path.iterdir()] == ["snap"]
    path = tmp_path / "u.recapmem"
    mem.save(str(path))
    first = path.read_bytes()
    mem.save(str(path), fingerprint=5)  # replaced whole
    assert path.read_bytes() != first and PersistentMemory.inspect(str(path))["fingerprint"] == 5


def test_pool_scopes_save_and_load(tmp_path):
    pool = MemoryPool(1 << 30)
    dec = new_decoder(pool)
    run(dec, "A", 0)
    pool.save("A", tmp_path / "a.recapmem", fingerprint=recap.memory_fingerprint(text_model("Llama")))
    other = MemoryPool(1 << 30)
    other.load("A2", tmp_path / "a.recapmem", vocab_size=V, k=8)
    assert other.stats()["A2"]["rows"] == pool.stats()["A"]["rows"]
    with pytest.raises(KeyError, match="no such scope"):
        pool.save("nope", tmp_path / "x")
    with pytest.raises(ValueError, match="max_bytes"):
        MemoryPool(-1)


@pytest.mark.parametrize("drafter", ["pld", "sam", "ar"])
def test_a_scope_on_a_drafter_without_a_persistent_memory_changes_nothing(drafter):
    """Drafters that keep no rows draft from the request alone: a scope is accepted (as for
    any decoder with a pool) and holds no rows, and the output is plain greedy's."""
    pool = MemoryPool(1 << 30)
    dec = new_decoder(pool, drafter)
    ids = prompt(3)
    want = dec.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW,
                              eos_token_id=None, pad_token_id=0)
    assert torch.equal(dec.generate(ids, max_new_tokens=MAX_NEW, eos_token_id=None, memory_scope="A"), want)
    assert pool.stats()["A"]["rows"] == 0
