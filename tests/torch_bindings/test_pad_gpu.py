"""pad_token_groups / unpad_token_groups kernels on the GPU: bit-exact to the reference, no sync,
clamped garbage offsets, CUDA graphs, torch.compile, no recompiles."""

from __future__ import annotations

import pytest
import torch
from conftest import no_sync, random_bits, random_group_ends

import torch_bindings
from torch_bindings import reference

pytestmark = pytest.mark.gpu

_SPECIAL = (0, 1, 31, 33, 0, 127, 129, 1)  # empty groups, 1 row, just under / over an alignment


def _data(rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random bit patterns (NaN payloads, -0, Inf, subnormals included) of ``dtype`` on the GPU."""
    return random_bits((rows, cols), dtype, seed, "cuda")


def _offsets(ends) -> torch.Tensor:
    return torch.tensor(ends, dtype=torch.int32, device="cuda")


def _assert_same_bytes(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    a = actual.contiguous().view(torch.uint8)
    e = expected.to(actual.device).contiguous().view(torch.uint8)
    if not torch.equal(a, e):
        mismatch = (a != e).nonzero()
        raise AssertionError(f"{mismatch.shape[0]} bytes differ, first at {mismatch[:4].tolist()}")


# (tokens, D, G, alignment, dtype): a sample of the cross product that covers every value of each axis
# (and every D with both dtypes) without running all of it.
_B, _F = torch.bfloat16, torch.float32
CASES = [
    (0, 32, 1, 32, _B),
    (0, 7168, 8, 128, _F),
    (1, 7, 1, 16, _B),
    (1, 1536, 4, 64, _F),
    (128, 32, 2, 128, _F),
    (128, 7, 1024, 32, _F),
    (157, 1536, 16, 16, _B),
    (157, 7, 64, 64, _B),
    (157, 7168, 1024, 128, _B),
    (4096, 32, 256, 32, _B),
    (4096, 1536, 8, 128, _F),
    (4096, 7, 4, 16, _F),
    (16392, 7168, 16, 32, _F),
    (16392, 1536, 1024, 64, _B),
    (16392, 32, 2, 16, _F),
    (131072, 7168, 8, 32, _B),
    (131072, 1536, 64, 128, _F),
    (131072, 7, 256, 64, _B),
]


@pytest.mark.parametrize("tokens,cols,groups,alignment,dtype", CASES)
def test_pad_unpad_match_reference(tokens, cols, groups, alignment, dtype, poison_cuda_allocator):
    seed = tokens * 7 + cols * 3 + groups
    x = _data(tokens, cols, dtype, seed)
    ends = _offsets(random_group_ends(tokens, groups, torch.Generator().manual_seed(seed), special=_SPECIAL))
    poison_cuda_allocator()
    with no_sync():
        padded, start, end = torch_bindings.pad_token_groups(x, ends, alignment=alignment, backend="cute")
    want, want_start, want_end = reference.pad_token_groups(x, ends, alignment=alignment)
    _assert_same_bytes(padded, want)
    _assert_same_bytes(start, want_start)
    _assert_same_bytes(end, want_end)

    poison_cuda_allocator()
    with no_sync():
        back = torch_bindings.unpad_token_groups(padded, ends, start, num_tokens=tokens, backend="cute")
    _assert_same_bytes(back, reference.unpad_token_groups(want, ends, want_start, num_tokens=tokens))
    last = int(ends[-1])
    _assert_same_bytes(back[:last], x[:last])  # the round trip is the identity on the grouped rows


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float16, torch.float8_e4m3fn, torch.float8_e5m2, torch.int8, torch.uint8, torch.bool,
        torch.int32, torch.int64, torch.float64, torch.complex64, torch.float8_e8m0fnu,
    ],
)  # fmt: skip
@pytest.mark.parametrize("cols", [96, 5])
def test_other_dtypes(dtype, cols):
    x = _data(1000, cols, dtype, cols)
    ends = _offsets([0, 1, 333, 333, 999])
    padded, start, end = torch_bindings.pad_token_groups(x, ends, alignment=32, backend="cute")
    want = reference.pad_token_groups(x, ends, alignment=32)
    for got, expected in zip((padded, start, end), want, strict=True):
        _assert_same_bytes(got, expected)
    back = torch_bindings.unpad_token_groups(padded, ends, start, num_tokens=1000, backend="cute")
    _assert_same_bytes(back, reference.unpad_token_groups(padded, ends, start, num_tokens=1000))


def test_unaligned_pointer_takes_narrow_path():
    """A view 2 bytes past a 16-byte boundary: element-wide accesses, same bytes."""
    base = _data(1, 300 * 64 + 1, torch.bfloat16, 3).view(-1)
    x = base[1:].view(300, 64)
    ends = _offsets([100, 250, 300])
    padded, start, _ = torch_bindings.pad_token_groups(x, ends, alignment=16, backend="cute")
    _assert_same_bytes(padded, reference.pad_token_groups(x, ends, alignment=16)[0])
    out_base = torch.empty(padded.numel() + 1, dtype=padded.dtype, device="cuda")
    shifted = out_base[1:].view_as(padded)
    shifted.copy_(padded)
    back = torch_bindings.unpad_token_groups(shifted, ends, start, num_tokens=300, backend="cute")
    _assert_same_bytes(back, x)


def test_empty_rows_and_columns():
    ends = _offsets([0, 0, 0])
    x = _data(5, 0, torch.bfloat16, 1)
    padded, start, end = torch_bindings.pad_token_groups(x, _offsets([2, 2, 5]), alignment=16, backend="cute")
    assert padded.shape == (reference.padded_rows(5, 3, 16), 0)
    assert start.tolist() == [0, 16, 16] and end.tolist() == [16, 16, 32]
    empty = torch_bindings.unpad_token_groups(padded, ends, start, num_tokens=0, backend="cute")
    assert empty.shape == (0, 0)


def test_unpad_without_num_tokens_reads_the_last_offset():
    x = _data(300, 40, torch.float32, 5)
    ends = _offsets([100, 100, 260])
    padded, start, _ = torch_bindings.pad_token_groups(x, ends, alignment=64, backend="cute")
    back = torch_bindings.unpad_token_groups(padded, ends, start, backend="cute")  # syncs (documented)
    _assert_same_bytes(back, x[:260])


def test_unpad_without_num_tokens_rejects_a_garbage_last_offset():
    x = _data(300, 40, torch.bfloat16, 6)
    ends = _offsets([100, 260])
    padded, start, _ = torch_bindings.pad_token_groups(x, ends, alignment=32, backend="cute")
    garbage = _offsets([100, 10**9])
    with pytest.raises(ValueError, match=r"group_end_offsets\[-1\] = 1000000000 must be in \[0, 384\]"):
        torch_bindings.unpad_token_groups(padded, garbage, start, backend="cute")


def _clamped_groups(ends: list[int], total: int) -> list[tuple[int, int]]:
    """Python model of the kernels' offset clamping (``cute_utils.groups.group_bounds``)."""
    bounds, previous = [], 0
    for e in ends:
        end = min(max(e, 0), total)
        bounds.append((previous, max(end, previous)))
        previous = end
    return bounds


def test_garbage_offsets_are_clamped():
    """Offsets the kernels cannot validate (decreasing, negative, past the end): no fault, and the
    result is the documented clamping."""
    x = _data(300, 24, torch.bfloat16, 9)
    raw = [5000, -7, 120, 3, 1 << 30]
    padded, start, end = torch_bindings.pad_token_groups(x, _offsets(raw), alignment=16, backend="cute")
    rows = padded.shape[0]
    expected = torch.zeros_like(padded.view(torch.int16))
    row = 0
    for g, (lo, hi) in enumerate(_clamped_groups(raw, 300)):
        assert start[g] == row
        # Decreasing offsets make the clamped sizes sum past M: rows past the output are dropped.
        count = max(min(hi - lo, rows - row), 0)
        expected[row : row + count] = x.view(torch.int16)[lo : lo + count]
        row += -(-(hi - lo) // 16) * 16
        assert end[g] == row
    _assert_same_bytes(padded.view(torch.int16), expected)

    bad_start = _offsets([-5, 1 << 30, 7, -(2**31), 2**31 - 1])
    back = torch_bindings.unpad_token_groups(padded, _offsets(raw), bad_start, num_tokens=300, backend="cute")
    torch.cuda.synchronize()
    assert back.shape == (300, 24)
    # Unpad lays the clamped groups out back to back: rows 0..300 are group 0 (clamped size 300),
    # whose source starts at padded row -5: the 5 rows with no source are zero.
    assert not back[:5].view(torch.int16).any()
    _assert_same_bytes(back[5:], padded[:295])


def test_cuda_graph_replay_with_new_offsets():
    tokens, cols, groups = 3000, 96, 8
    gen = torch.Generator().manual_seed(11)
    x = _data(tokens, cols, torch.bfloat16, 11)
    ends = _offsets(random_group_ends(tokens, groups, gen))
    torch_bindings.pad_token_groups(x, ends)  # compile / load outside capture
    padded, start, _ = torch_bindings.pad_token_groups(x, ends)
    torch_bindings.unpad_token_groups(padded, ends, start, num_tokens=tokens)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        padded, start, end = torch_bindings.pad_token_groups(x, ends)
        back = torch_bindings.unpad_token_groups(padded, ends, start, num_tokens=tokens)
    for seed in range(3):
        x.copy_(_data(tokens, cols, torch.bfloat16, 100 + seed))
        ends.copy_(_offsets(random_group_ends(tokens, groups, gen.manual_seed(100 + seed))))
        graph.replay()
        torch.cuda.synchronize()
        want = reference.pad_token_groups(x, ends, alignment=32)
        for got, expected in zip((padded, start, end), want, strict=True):
            _assert_same_bytes(got, expected)
        _assert_same_bytes(back, reference.unpad_token_groups(want[0], ends, want[1], num_tokens=tokens))


def test_torch_compile_fullgraph_no_recompiles():
    @torch.compile(fullgraph=True, dynamic=True)
    def round_trip(x, ends):
        padded, start, end = torch_bindings.pad_token_groups(x, ends, alignment=64)
        back = torch_bindings.unpad_token_groups(padded, ends, start, num_tokens=x.shape[0])
        return padded, start, end, back

    gen = torch.Generator().manual_seed(5)
    for i, tokens in enumerate((1000, 2500, 4099)):
        x = _data(tokens, 256, torch.bfloat16, tokens)
        ends = _offsets(random_group_ends(tokens, 8, gen))
        if i == 1:
            before = torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads
        padded, start, end, back = round_trip(x, ends)
        want = reference.pad_token_groups(x, ends, alignment=64)
        for got, expected in zip((padded, start, end), want, strict=True):
            _assert_same_bytes(got, expected)
        _assert_same_bytes(back, reference.unpad_token_groups(want[0], ends, want[1], num_tokens=tokens))
    assert torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads == before


def test_no_recompiles_across_sizes_and_offsets():
    gen = torch.Generator().manual_seed(9)
    warm = _data(64, 128, torch.bfloat16, 0)
    padded, start, _ = torch_bindings.pad_token_groups(warm, _offsets([10, 64]))
    torch_bindings.unpad_token_groups(padded, _offsets([10, 64]), start, num_tokens=64)
    before = torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads
    shapes = [(17, 1, 16), (999, 3, 32), (4096, 17, 64), (70001, 1024, 128), (0, 5, 32)]
    for tokens, groups, alignment in shapes:
        x = _data(tokens, 128, torch.bfloat16, tokens)
        ends = _offsets(random_group_ends(tokens, groups, gen))
        padded, start, _ = torch_bindings.pad_token_groups(x, ends, alignment=alignment)
        torch_bindings.unpad_token_groups(padded, ends, start, num_tokens=tokens)
    assert torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads == before
