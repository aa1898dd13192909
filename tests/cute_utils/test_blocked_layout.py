"""The blocked scale layout's one description (``cute_utils.blocked``) against SPEC section 3 and the
reference, on the CPU.

``blocked_layout`` (the CuTe tile atom tiled to the padded shape) is evaluated on the host: inside a
traced ``@cute.jit`` function static layouts and the kernels' index functions called with Python
ints evaluate at trace time, so one ``cute.compile`` of an empty function collects every offset.
Every (r, c) of several padded shapes is checked: the layout against SPEC's formula, the kernels'
index functions against the layout, and ``torch_bindings.reference.blocked_offsets`` (its own torch
arithmetic) against the layout.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import pytest
import torch

from cute_utils import blocked
from torch_bindings import reference as ref

# The host evaluations unroll static loops over every (r, c): the DSL warns about their length.
pytestmark = pytest.mark.filterwarnings("ignore:This static loop has")

# (rows, cols) of S: padded shapes of 1..3 row blocks and 1..3 column tiles, with ragged edges.
SHAPES = [(1, 1), (128, 4), (130, 5), (200, 9), (256, 8), (384, 12), (77, 3)]


def _spec_offset(r: int, c: int, cp: int) -> int:
    return ((r // 128) * (cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def _evaluate(rows: int, cols: int) -> dict[str, object]:
    """Trace-time values over every (r, c) of the padded (Rp, Cp): the layout's, the index functions'
    (``blocked_offset``, ``blocked_row_word``), and the layout's shape and size."""
    rp, cp = ref.blocked_shape(rows, cols)
    found: dict[str, object] = {}

    @cute.jit
    def trace():
        layout = blocked.blocked_layout(rows, cols)
        found["size"] = cute.size(layout)
        found["cosize"] = cute.cosize(layout)
        layout_rows, offset_rows, row_words = [], [], []
        for r in cutlass.range_constexpr(rp):
            layout_row, offset_row = [], []
            for c in cutlass.range_constexpr(cp):
                layout_row.append(cute.crd2idx((r, c), layout))
                offset_row.append(blocked.blocked_offset(r, c, cp // 4))
            layout_rows.append(layout_row)
            offset_rows.append(offset_row)
            row_words.append(blocked.blocked_row_word(r % 128))
        found["layout"], found["offset"], found["row_word"] = layout_rows, offset_rows, row_words

    cute.compile(trace)
    return found


@pytest.fixture(scope="module")
def evaluated() -> dict[tuple[int, int], dict[str, object]]:
    return {shape: _evaluate(*shape) for shape in SHAPES}


@pytest.mark.parametrize("shape", SHAPES)
def test_layout_is_spec_formula(evaluated, shape):
    rp, cp = ref.blocked_shape(*shape)
    got = evaluated[shape]
    assert got["size"] == rp * cp and got["cosize"] == rp * cp  # a bijection onto the bytes
    want = [[_spec_offset(r, c, cp) for c in range(cp)] for r in range(rp)]
    assert got["layout"] == want


@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_index_functions_follow_layout(evaluated, shape):
    """The functions the kernels store through are the layout: byte offsets, and each row's word
    (its 4 scales of one tile) inside its tile."""
    rp, _ = ref.blocked_shape(*shape)
    got = evaluated[shape]
    assert got["offset"] == got["layout"]
    for r in range(rp):
        assert got["row_word"][r] * 4 == got["layout"][r % 128][0]


@pytest.mark.parametrize("shape", SHAPES)
def test_reference_offsets_follow_layout(evaluated, shape):
    rows, cols = shape
    layout = torch.tensor(evaluated[shape]["layout"], dtype=torch.int64)
    assert torch.equal(ref.blocked_offsets(rows, cols), layout[:rows, :cols])


def test_atom_is_cutlass_scale_factor_atom():
    """The atom is CUTLASS's tcgen05 scale-factor atom (K-major, ``BlockScaledBasicChunk``) with one
    scale per column: the same byte for every (row, column) of a 128 x 4 tile."""
    from cutlass.utils.blockscaled_layout import BlockScaledBasicChunk

    pairs: list[tuple[int, int]] = []

    @cute.jit
    def trace():
        ours = blocked.blocked_atom()
        theirs = BlockScaledBasicChunk(1).layout  # ((32, 4), (1, 4)) : ((16, 4), (0, 1))
        for r in cutlass.range_constexpr(128):
            for c in cutlass.range_constexpr(4):
                pairs.append((cute.crd2idx((r, c), ours), cute.crd2idx((r, (0, c)), theirs)))

    cute.compile(trace)
    assert len(pairs) == 512
    assert all(a == b for a, b in pairs)
    assert sorted(a for a, _ in pairs) == list(range(512))
