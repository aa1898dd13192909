"""The fuzz generator (tests/support/fuzz.py) on CPU: valid, edge-favouring group patterns, and the harness
end to end through the reference (the kernels run in tests/torch_bindings/test_fuzz_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import fuzz


@settings(max_examples=300, database=None, deadline=None)
@given(total=st.integers(0, 5000), tile=st.sampled_from([1, 4, 16, 128]), data=st.data())
def test_group_ends_are_valid(total, tile, data):
    ends = data.draw(fuzz.group_ends(total, tile=tile))
    assert 1 <= len(ends) <= fuzz.MAX_GROUPS
    assert all(0 <= e <= total for e in ends)
    assert all(a <= b for a, b in zip(ends, ends[1:], strict=False))


def test_group_patterns_reach_the_edges():
    """Over many draws: empty first and last groups, runs of empties, one-unit groups, everything in
    one group, rows past the last group, and the largest group count all show up."""
    seen = set()

    @settings(max_examples=400, database=None, deadline=None)
    @given(fuzz.group_ends(1000, tile=128))
    def record(ends):
        sizes = [b - a for a, b in zip([0, *ends], ends, strict=False)]
        seen.add("empty_first" if sizes[0] == 0 else "")
        seen.add("empty_last" if len(sizes) > 1 and sizes[-1] == 0 else "")
        seen.add("empty_run" if any(sizes[i : i + 3] == [0, 0, 0] for i in range(len(sizes))) else "")
        seen.add("one_unit" if 1 in sizes else "")
        seen.add("all_in_one" if 1000 in sizes else "")
        seen.add("rows_past_last" if ends[-1] < 1000 else "")
        seen.add("tile_edge" if any(s in (127, 129) for s in sizes) else "")
        seen.add("max_groups" if len(ends) == fuzz.MAX_GROUPS else "")

    record()
    want = {"empty_first", "empty_last", "empty_run", "one_unit", "all_in_one", "rows_past_last",
            "tile_edge", "max_groups"}  # fmt: skip
    assert want <= seen, want - seen


@pytest.mark.parametrize("op", fuzz.OPS)
def test_harness_runs_through_the_reference(op):
    fuzz.fuzz(op, fuzz_seed=0, examples=4, limits=fuzz.SMALL, run=fuzz.Run("cpu", "reference"))


def test_strides_compare_only_dims_that_address_memory():
    column = torch.zeros(32, 1)
    assert fuzz.same_strides(column, torch.zeros(1, 32).t())  # (1, 1) vs (1, 32): size-1 dim
    assert not fuzz.same_strides(torch.zeros(4, 8), torch.zeros(8, 4).t())
    assert fuzz.same_strides(torch.zeros(0, 8), torch.zeros(8, 0).t())


def test_bounded_ops_compare_the_rows_below_the_last_end():
    """The bounded ops are fuzzed (and run on garbage offsets) and compared only on the rows their
    contract defines; the other ops on every row."""
    assert set(fuzz.BOUNDED_OPS) <= set(fuzz.GROUPED_OPS)
    case = fuzz.Case("fp8_dequant", (10, 4), torch.float8_e4m3fn, 0, (3, 7))
    assert fuzz.defined_rows(case, torch.zeros(10, 4)).shape == (7, 4)
    whole = fuzz.Case("fp8_cols", (10, 4), torch.bfloat16, 0, (3, 7))
    assert fuzz.defined_rows(whole, torch.zeros(10, 4)).shape == (10, 4)
    dual = fuzz.Case("fp8_dual_padded", (10, 4), torch.bfloat16, 0, (3, 7))
    assert fuzz.defined_rows(dual, torch.zeros(10, 4), 0).shape == (7, 4)  # q_row
    assert fuzz.defined_rows(dual, torch.zeros(64, 4), 2).shape == (64, 4)  # q_col: whole
