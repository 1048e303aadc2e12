"""The bounds benchmark in its tiny mode: it runs, cross-request structures stay within
their configured bounds, and the pool stays within its byte bound between requests."""

import json

from recap import PersistentMemory
from scripts import load_script

ROW_BYTES = 128  # one K = 8 row: ids, probabilities, key, width, statistics, mark, index share


def load_bench():
    return load_script("benches/memory_bounds.py")


def test_tiny_bounds_run_stays_within_every_bound(tmp_path):
    bench = load_bench()
    assert bench.main(["--tiny", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bounds.json").read_text())
    rows = min(PersistentMemory(report["vocab"]).capacity, report["vocab"])  # U's row bound
    by_name = {m["drafter"]: m["samples"] for m in report["many"]}
    u = [s["persistent U"] for s in by_name["recap"]]
    assert u == sorted(u) and u[-1] > 0  # it fills up, then holds
    assert u[-1] <= rows * ROW_BYTES
    cg = [s["request C+G"] for s in by_name["recap"]]
    assert max(cg) <= 2 * 8192 * 8 * 16  # two tables of context_capacity rows
    pool = report["pool"]
    assert all(s["pool_bytes"] <= pool["max_bytes"] for s in pool["samples"])
    assert pool["samples"][-1]["evictions"] > 0  # the bound was reached and enforced
    assert (tmp_path / "bounds.md").read_text().startswith("vocabulary 2000")
