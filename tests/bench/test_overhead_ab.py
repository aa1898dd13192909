"""``bench.overhead_ab``: the rows it reads from ``bench_overhead``'s JSON and its verdict (no runs)."""

from __future__ import annotations

from bench.overhead_ab import ratios_of, summarize

DOC = {
    "title": "Eager host overhead per call (us)",
    "columns": [{"key": k, "header": k} for k in ("call", "host_us", "floor_us", "ratio", "runs", "status")],
    "rows": [
        {"call": "swizzle_scales plain", "host_us": 12.17, "floor_us": 10.32, "ratio": 1.179, "status": "ok"},
        {"call": "pad_token_groups", "host_us": 28.73, "floor_us": 23.98, "ratio": 1.198, "status": "ok"},
        {"call": "one new_empty", "host_us": 5.64, "floor_us": None, "ratio": None, "status": ""},
        {"call": "an op that raised", "host_us": None, "floor_us": None, "ratio": None, "status": "error"},
    ],
}


def test_ratios_of_reads_the_rows_with_a_ratio():
    assert ratios_of(DOC) == {"swizzle_scales plain": 1.179, "pad_token_groups": 1.198}
    assert ratios_of({}) == {}


def _runs(*values):
    return [{"a": v, "b": v} for v in values]


def test_verdicts():
    base = _runs(1.20, 1.21)
    same = _runs(1.20, 1.21)
    assert summarize(base, same, 0.005)[1].startswith("no worse")
    slower = _runs(1.25, 1.26)
    assert summarize(base, slower, 0.005)[1].startswith("worse")
    mixed = _runs(1.26, 1.19)
    assert summarize(base, mixed, 0.005)[1].startswith("unresolved")
    one_pair_within = _runs(1.201, 1.24)  # +0.001 and +0.03: not every pair worse
    assert summarize(base, one_pair_within, 0.005)[1].startswith("unresolved")
