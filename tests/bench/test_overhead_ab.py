"""``bench.overhead_ab``: the table it reads from ``bench_overhead`` and its verdict (no runs)."""

from __future__ import annotations

from bench.overhead_ab import parse_ratios, summarize

TABLE = """\
| call                   | host_us | floor_us | ratio | runs               | status |
|------------------------|---------|----------|-------|--------------------|--------|
| swizzle_scales plain   | 12.17   | 10.32    | 1.179 | 1.19 / 1.18 / 1.18 | ok     |
| pad_token_groups       | 28.73   | 23.98    | 1.198 | 1.19 / 1.20 / 1.23 | ok     |
| one new_empty          | 5.64    | n/a      | n/a   |                    |        |
"""


def test_parse_ratios_reads_the_rows_with_a_ratio():
    assert parse_ratios(TABLE) == {"swizzle_scales plain": 1.179, "pad_token_groups": 1.198}


def _runs(*values):
    return [{"a": v, "b": v} for v in values]


def test_verdicts():
    base = _runs(1.20, 1.21)
    _, verdict = summarize(base, _runs(1.20, 1.21), list(zip(base, _runs(1.20, 1.21), strict=True)), 0.005)
    assert verdict.startswith("no worse")
    head = _runs(1.25, 1.26)
    _, verdict = summarize(base, head, list(zip(base, head, strict=True)), 0.005)
    assert verdict.startswith("worse")
    head = _runs(1.26, 1.19)
    _, verdict = summarize(base, head, list(zip(base, head, strict=True)), 0.005)
    assert verdict.startswith("unresolved")
