"""The index math of the sm_90a FP8 grouped GEMM (``cute_kernels.grouped_gemm_sm90``) on a CPU.

- The ring offsets the 2d2d masking writes through (``ring_offset``, the kernel's own helper,
  evaluated at trace time) are where TMA's 128-byte swizzle puts each element.
- Pure-Python mirrors of the kernel's device math, against brute force, for group patterns that
  include empty groups, groups past M and garbage offsets: the tile scheduler (``_work``: every
  stored output element belongs to exactly one tile, in bounds) and the masking of a group's
  reduction boxes (``_zero_outside``: the boxes start at the group's start rounded down to the
  config's ``reduction_align``, a multiple of 16 by the 16-byte TMA coordinate rule; a slot issues
  exactly the 32-element wgmma blocks that meet the group, and in those exactly the elements before
  its start and past its end are zeroed, 64-bit words masked whole).
- The epilogue's staging tile (``_staging_layouts``, ``staged_byte``, evaluated at trace time):
  its tile and store-box views are the same bytes, in TMA's 128-byte swizzle.

The mirrors copy the kernel's formulas; a change there must change them too."""

from __future__ import annotations

import pytest

TILE_M = TILE_K = 128
THREADS = 256  # consumer threads
PATTERNS = {
    "ragged": [100, 100, 357, 612, 1000],
    "empty first and last": [0, 300, 777, 1000, 1000],
    "around the tile": [127, 255, 384, 513, 640, 768, 1000],
    "one-row groups": [1, 2, 3, 4, 1000],
    "all in one": [1000],
    "last end below M": [64, 500, 900],
    "garbage: past M, negative, decreasing": [-5, 40, 1 << 30, 7, 2000],
    "garbage: not monotone": [500, 10, 800],
}
M = 1000


def _tma_swizzle_128b(linear: int) -> int:
    """Where TMA's 128-byte swizzle stores byte ``linear`` of a 1024-byte aligned box: its 16-byte
    chunk index (bits 4-6) XOR the row within the 1024-byte pattern (bits 7-9)."""
    return linear ^ (((linear >> 7) & 7) << 4)


def test_ring_offsets_follow_the_tma_swizzle():
    import cutlass
    import cutlass.cute as cute

    from cute_kernels.grouped_gemm_sm90 import (
        GroupedGemmConfig,
        GroupedGemmSm90Kernel,
        GroupedGemmVariant,
        ring_offset,
    )

    config = GroupedGemmConfig(tile_n=64)
    got: dict = {}

    @cute.jit
    def probe():
        _, ring_a, ring_b = GroupedGemmSm90Kernel(GroupedGemmVariant("2d2d"), config)._layouts()
        for name, layout, rows in (("a", ring_a, TILE_M), ("b", ring_b, config.tile_n)):
            for r in cutlass.range_constexpr(rows):
                for c in cutlass.range_constexpr(0, TILE_K, 3):
                    got[name, r, c] = ring_offset(layout, r, c, config.stages - 1)

    cute.compile(probe, options="--gpu-arch sm_90a")
    assert len(got) == (TILE_M + config.tile_n) * len(range(0, TILE_K, 3))
    for (name, r, c), offset in got.items():
        box = (TILE_M if name == "a" else config.tile_n) * TILE_K
        assert offset == (config.stages - 1) * box + _tma_swizzle_128b(r * TILE_K + c), (name, r, c)


@pytest.mark.parametrize("tile_n", [256, 192])
def test_staging_views_are_the_tma_store_boxes(tile_n):
    """The epilogue's two views of its staging tile (``_staging_layouts``): element (r, c) of the
    (128, tile_n) tile is element (r, c % 64) of store box c // 64 (the same swizzle, byte-level),
    and ``staged_byte`` puts it where TMA's 128-byte swizzle reads it: boxes of 128-byte rows of
    bf16, one after the other."""
    import cutlass
    import cutlass.cute as cute

    from cute_kernels.grouped_gemm_sm90 import EPI_N, _staging_layouts, staged_byte

    got: dict = {}

    @cute.jit
    def probe():
        tile, boxes = _staging_layouts(tile_n)
        assert tile.inner == boxes.inner
        for r in cutlass.range_constexpr(0, TILE_M, 5):
            for c in cutlass.range_constexpr(0, tile_n, 5):
                in_boxes = cute.crd2idx((r, c % EPI_N, c // EPI_N), boxes.outer)
                got[r, c] = (cute.crd2idx((r, c), tile.outer), in_boxes, staged_byte(tile, r, c))

    cute.compile(probe, options="--gpu-arch sm_90a")
    assert len(got) == len(range(0, TILE_M, 5)) * len(range(0, tile_n, 5))
    box = TILE_M * EPI_N * 2
    for (r, c), (in_tile, in_boxes, byte) in got.items():
        assert in_tile == in_boxes == (c // EPI_N) * TILE_M * EPI_N + r * EPI_N + c % EPI_N, (r, c)
        assert byte == (c // EPI_N) * box + _tma_swizzle_128b(r * EPI_N * 2 + (c % EPI_N) * 2), (r, c)


def _issued_blocks(lo: int, hi: int) -> set[int]:
    """``_mainloop``'s wgmmas issued for a slot whose group elements are ``[lo, hi)``."""
    from cute_kernels.grouped_gemm_sm90 import MMA_K

    return {kb for kb in range(TILE_K // MMA_K) if kb * MMA_K < hi and kb * MMA_K + MMA_K > lo}


def _masked_words(lo: int, hi: int, rows: int) -> tuple[list[int], set[int]]:
    """Mirror of ``_zero_outside`` / ``_zero_chunk`` (and ``_low_bytes``) on one ring slot of
    ``rows`` rows: the physical 8-byte words written, in order, by all consumer threads, and the
    physical bytes those writes leave zero (a word stored as zero, or ANDed with the mask of the
    bytes that stay)."""
    from cute_kernels.grouped_gemm_sm90 import MMA_K

    per_block, words, zeroed = MMA_K // 16, [], set()
    head_block, tail_block = lo // MMA_K, (hi - 1) // MMA_K
    blocks, first_block = (1, head_block) if lo > 0 else (0, tail_block)
    if hi < TILE_K and not (lo > 0 and tail_block == head_block):
        blocks += 1
    per_row = per_block * blocks
    for ctid in range(THREADS):
        for item in range(ctid, rows * per_row, THREADS):
            row, j = item // per_row, item % per_row
            block = first_block if j < per_block else tail_block
            first = (block * per_block + j % per_block) * 16
            if not (first < lo or first + 16 > hi):
                continue
            base = _tma_swizzle_128b(row * TILE_K + first)
            for w in range(2):
                start = first + 8 * w
                keep_from, keep_to = min(max(lo - start, 0), 8), min(max(hi - start, 0), 8)
                if keep_to - keep_from >= 8:
                    continue
                words.append(base + 8 * w)
                kept = range(keep_from, keep_to) if keep_to > keep_from else range(0)
                zeroed |= {base + 8 * w + b for b in range(8) if b not in kept}
    return words, zeroed


@pytest.mark.parametrize("rows", [TILE_M + 256, TILE_M + 64])
@pytest.mark.parametrize("lo", [0, 1, 7, 15, 16, 17, 31, 32, 63, 100, 127])
def test_masking_zeroes_exactly_the_elements_outside_the_group(rows, lo):
    """In the wgmmas a slot issues (every one that meets ``[lo, hi)``, no other), exactly the
    elements outside ``[lo, hi)`` are zeroed, each word once."""
    from cute_kernels.grouped_gemm_sm90 import MMA_K

    for hi in range(lo + 1, TILE_K + 1):
        if lo == 0 and hi == TILE_K:
            continue  # a full box: the kernel masks nothing
        issued = _issued_blocks(lo, hi)
        assert issued == set(range(lo // MMA_K, (hi - 1) // MMA_K + 1)), (lo, hi)
        words, zeroed = _masked_words(lo, hi, rows)
        outside = [c for c in range(TILE_K) if (c < lo or c >= hi) and c // MMA_K in issued]
        expected = {_tma_swizzle_128b(r * TILE_K + c) for r in range(rows) for c in outside}
        assert len(words) == len(set(words)), f"[{lo}, {hi}): a word written twice"
        assert zeroed == expected, f"[{lo}, {hi})"


def _bounds(ends: list[int], total: int) -> list[tuple[int, int]]:
    """``cute_utils.groups.group_bounds`` / ``smem_group_bounds``: start = the previous end clamped to
    [0, total], end = max(own end clamped, start)."""
    clamped = [min(max(e, 0), total) for e in ends]
    out = []
    for g, end in enumerate(clamped):
        start = clamped[g - 1] if g else 0
        out.append((start, max(end, start)))
    return out


def _find_group(prefix: list[int], groups: int, key: int, steps: int = 9) -> int:
    """``cute_utils.groups.find_group``."""
    pos = 0
    for k in range(steps):
        candidate = pos + (1 << (steps - 1 - k))
        if candidate < groups and prefix[candidate] <= key:
            pos = candidate
    return pos


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _tiles_2d3d(ends: list[int], n: int, tile_n: int, cluster: int) -> list[tuple[int, int, int, int, int]]:
    """Mirror of ``_scan_tiles`` + ``_work`` (2d3d): ``(unit, g, row0, row_end, col0)`` per tile, a
    work unit being ``cluster`` column blocks of one row block (``rank`` picks the block)."""
    bounds = _bounds(ends, M)
    prefix = [0]
    for start, end in bounds:
        prefix.append(prefix[-1] + (end - start + TILE_M - 1) // TILE_M)
    n_units = _ceil(_ceil(n, tile_n), cluster)
    tiles = []
    for unit in range(prefix[-1] * n_units):
        for rank in range(cluster):
            row_block, n_block = unit // n_units, unit % n_units * cluster + rank
            g = _find_group(prefix, len(ends), row_block)
            start, end = bounds[g]
            tiles.append((unit, g, start + (row_block - prefix[g]) * TILE_M, end, n_block * tile_n))
    return tiles


@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.parametrize(
    ("tile_n", "n", "cluster"), [(128, 200, 1), (192, 200, 1), (256, 200, 2), (128, 320, 2)]
)
def test_2d3d_tiles_cover_each_group_once(name, tile_n, n, cluster):
    """Every element of every group is stored once; a cluster's tiles share the row block (the A
    box they multicast), so the same group and reduction; a tile past the output stores nothing."""
    stored: list[tuple[int, int, int]] = []
    units: dict[int, set] = {}
    for unit, g, row0, row_end, col0 in _tiles_2d3d(ends := PATTERNS[name], n, tile_n, cluster):
        assert 0 <= g < len(ends) and 0 <= row0 < row_end <= M and col0 >= 0
        units.setdefault(unit, set()).add((g, row0))
        # ``_epilogue``: a tile whole in its rows goes out as TMA boxes (all TILE_M rows, columns
        # clipped at n), a tile cut by its group's end as row stores below the end
        whole = row0 + TILE_M <= row_end
        rows = range(row0, row0 + TILE_M) if whole else range(row0, row_end)
        cols = range(col0, min(col0 + tile_n, n))
        stored += [(g, r, c) for r in rows for c in cols]
    assert all(len(shared) == 1 for shared in units.values()), "a cluster's tiles in two row blocks"
    expected = [(g, r, c) for g, (s, e) in enumerate(_bounds(ends, M)) for r in range(s, e) for c in range(n)]
    assert sorted(stored) == sorted(expected)
    if not name.startswith("garbage"):  # clamped garbage ends that fall may overlap: in bounds only
        assert len({(r, c) for _, r, c in stored}) == len(stored), "an element stored twice"


@pytest.mark.parametrize(("rows", "cols", "cluster"), [(200, 300, 1), (320, 512, 2), (256, 200, 2)])
def test_2d2d_tiles_cover_each_output_once(rows, cols, cluster):
    """Mirror of ``_scan_tiles`` + ``_work`` (2d2d, tile_n = 256): every (g, row, col) of the (E, N,
    K) output is stored once; a cluster's tiles share the group and column block (the B box they
    multicast, so the same reduction and k-tiles); a row block past N stores nothing (TMA clips)."""
    groups, tile_n = 3, 256
    m_units = _ceil(_ceil(rows, TILE_M), cluster)
    n_tiles = _ceil(cols, tile_n)
    stored, units = [], {}
    for unit in range(groups * m_units * n_tiles):
        for rank in range(cluster):
            g, rest = unit // (m_units * n_tiles), unit % (m_units * n_tiles)
            m_block, n_block = rest // n_tiles * cluster + rank, rest % n_tiles
            units.setdefault(unit, set()).add((g, n_block))
            row0, col0 = m_block * TILE_M, n_block * tile_n
            stored += [
                (g, r, c)
                for r in range(row0, min(row0 + TILE_M, rows))
                for c in range(col0, min(col0 + tile_n, cols))
            ]
    assert all(len(shared) == 1 for shared in units.values())
    assert sorted(stored) == [(g, r, c) for g in range(groups) for r in range(rows) for c in range(cols)]


@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.parametrize("align", [16, 32, 64, 128])
def test_2d2d_reduction_boxes_cover_each_group_once(name, align):
    """Mirror of ``_work`` (2d2d): the boxes of group g start at its start rounded down to the
    config's ``reduction_align`` (a TMA box's innermost coordinate is a multiple of 16 bytes), and
    the elements the masking keeps
    (``[head, TILE_K)`` of the first box, ``[0, tail)`` of the last) are exactly the group's rows;
    empty groups run no stage (both sides)."""
    ends = PATTERNS[name]
    for start, end in _bounds(ends, M):
        red0 = start - start % align
        k_tiles = -(-(end - red0) // TILE_K) if end > start else 0
        head, tail = start - red0, end - red0 - (k_tiles - 1) * TILE_K
        kept = []
        for kt in range(k_tiles):
            lo, hi = 0, TILE_K
            if (kt == 0 and head > 0) or (kt == k_tiles - 1 and tail < TILE_K):  # _mainloop's test
                lo = head if kt == 0 else 0
                hi = tail if kt == k_tiles - 1 else TILE_K
            kept += [red0 + kt * TILE_K + c for c in range(lo, hi)]
        assert red0 % 16 == 0 and 0 <= head < align <= TILE_K
        assert kept == list(range(start, end))
        assert k_tiles == 0 or (1 <= tail <= TILE_K and (k_tiles > 1 or head < tail))
