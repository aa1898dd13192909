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
    same = _runs(1.20, 1.21)
    assert summarize(base, same, 0.005)[1].startswith("no worse")
    slower = _runs(1.25, 1.26)
    assert summarize(base, slower, 0.005)[1].startswith("worse")
    mixed = _runs(1.26, 1.19)
    assert summarize(base, mixed, 0.005)[1].startswith("unresolved")
    one_pair_within = _runs(1.201, 1.24)  # +0.001 and +0.03: not every pair worse
    assert summarize(base, one_pair_within, 0.005)[1].startswith("unresolved")


def test_the_ratio_column_is_found_by_its_header():
    table = TABLE.replace("| ratio |", "| ratio_x |").replace("| call", "| call")
    assert parse_ratios(table) == {}
