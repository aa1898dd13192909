"""Fixed-seed fuzz of every op that takes group offsets (and the 3D ops) against the reference on the
GPU (tests/support/fuzz.py: edge-favouring group patterns, dirty memory, byte comparison, no sync), and the
garbage-offset patterns (negative, decreasing, past the end, INT_MAX, INT_MIN): no fault.
``make fuzz`` runs the same generator for minutes with any seed."""

from __future__ import annotations

import pytest
import torch

from tests.support import fuzz

pytestmark = pytest.mark.gpu

SEEDS = (0, 1, 2, 3)
EXAMPLES = 25  # per (op, seed)


@pytest.mark.parametrize("fuzz_seed", SEEDS)
@pytest.mark.parametrize("op", fuzz.OPS)
def test_fuzz(op, fuzz_seed):
    fuzz.fuzz(op, fuzz_seed, EXAMPLES, shrink=False)


@pytest.mark.parametrize("op", fuzz.GROUPED_OPS)
def test_garbage_offsets_never_fault(op):
    assert fuzz.check_garbage(op) == len(fuzz.GARBAGE)
    torch.cuda.synchronize()
