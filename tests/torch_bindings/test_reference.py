"""Tests of the pure-PyTorch reference (``torch_bindings.reference``) against SPEC.md.

The numerics are checked against implementations written independently of the reference: a scalar
one (Python floats, ``struct``, ``math.frexp``, nearest-value search) and a vectorized NumPy float64
one. The layouts are checked against PyTorch core's ``to_blocked`` composed per group, and the
padding against a Python loop over groups. CPU only.
"""

from __future__ import annotations

import bisect
import math
import random
import struct

import numpy as np
import pytest
import torch
from conftest import random_bits

import torch_bindings as tb
from torch_bindings import checks
from torch_bindings import reference as ref

# PyTorch core's blocked layout; its module needs `expecttest` (extra `test`, installed by CI).
torch_to_blocked = pytest.importorskip("torch.testing._internal.common_quantized").to_blocked

E8M0 = torch.float8_e8m0fnu
E4M3 = torch.float8_e4m3fn
MODES = ("floor", "rceil")
DTYPES = (torch.float32, torch.bfloat16)
BF16_MAX = 3.3895313892515355e38  # (2 - 2^-7) * 2^127

# random fp32 bit patterns include signalling NaNs, which NumPy warns about when casting
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def assert_bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    size = a.element_size()
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
    assert torch.equal(a.contiguous().view(ints), b.contiguous().view(ints))


def offsets(sizes: list[int]) -> torch.Tensor:
    return torch.tensor(np.cumsum(sizes), dtype=torch.int32)


# ------------------------------------------------------------------------------------------------
# Independent scalar implementation of SPEC section 2 (Python floats; no torch)
# ------------------------------------------------------------------------------------------------


def f32(v: float) -> float:
    """Round a Python float to the nearest fp32 (RNE, subnormals kept)."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def f32_bits(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def floor_log2(v: float) -> int:
    m, e = math.frexp(v)  # v = m * 2^e, 0.5 <= m < 1
    return e - 1


def ceil_log2(v: float) -> int:
    m, e = math.frexp(v)
    return e - 1 if m == 0.5 else e


def scalar_scale(a: float, mode: str) -> int:
    """E8M0 byte from a block's max magnitude, via logarithms instead of bit fields.

    floor: E(a) - 8 for normal a is floor(log2 a) + 119; rceil: smallest s with 2^(s-127) >= d, which
    is what the bit rule computes for normal and subnormal d alike.
    """
    if math.isnan(a) or math.isinf(a):
        return 255
    if mode == "floor":
        return 0 if a < 2.0**-126 else max(floor_log2(a) + 127 - 8, 0)
    d = f32(a * f32(1.0 / 448.0))
    return 0 if d == 0 else min(255, max(0, ceil_log2(d) + 127))


def e4m3_value(code: int) -> float:
    e, m = code >> 3, code & 7
    return m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)


E4M3_TABLE = [e4m3_value(c) for c in range(127)]  # all non-negative finite values, increasing


def scalar_e4m3(v: float) -> int:
    """Byte of the E4M3 value nearest to v (ties to the even code), saturating; NaN -> 0x7F."""
    if math.isnan(v):
        return 0x7F
    sign = 0x80 if math.copysign(1.0, v) < 0 else 0
    a = min(abs(v), 448.0)
    i = bisect.bisect_left(E4M3_TABLE, a)
    if E4M3_TABLE[i] == a:
        return sign | i
    lo, hi = i - 1, i
    dl, dh = a - E4M3_TABLE[lo], E4M3_TABLE[hi] - a
    code = lo if dl < dh else hi if dh < dl else (lo if lo % 2 == 0 else hi)
    return sign | code


def scalar_block(xs: list[float], mode: str) -> tuple[int, list[int]]:
    a = 0.0
    for v in xs:
        a = math.nan if math.isnan(v) or math.isnan(a) else max(a, abs(v))
    s = scalar_scale(a, mode)
    if s == 255:
        return s, [0x7F] * len(xs)
    return s, [scalar_e4m3(math.ldexp(v, 127 - s)) for v in xs]


# ------------------------------------------------------------------------------------------------
# Independent vectorized implementation (NumPy float64)
# ------------------------------------------------------------------------------------------------

NP_TABLE = np.array(E4M3_TABLE, dtype=np.float64)


def np_scale(a: np.ndarray, mode: str) -> np.ndarray:
    a = a.astype(np.float64)
    bad = ~np.isfinite(a)
    a = np.where(bad, 1.0, a)
    if mode == "floor":
        m, e = np.frexp(a)
        s = np.where(a < 2.0**-126, 0, np.maximum(e - 1 + 127 - 8, 0))
    else:
        d = (a * np.float64(np.float32(1.0 / 448.0))).astype(np.float32).astype(np.float64)
        m, e = np.frexp(d)
        cl = np.where(m == 0.5, e - 1, e)
        s = np.where(d == 0, 0, np.clip(cl + 127, 0, 255))
    return np.where(bad, 255, s).astype(np.uint8)


def np_e4m3(v: np.ndarray) -> np.ndarray:
    nan = np.isnan(v)
    neg = np.signbit(v)
    a = np.minimum(np.abs(np.where(nan, 0.0, v)), 448.0)
    i = np.searchsorted(NP_TABLE, a, side="left")
    exact = NP_TABLE[i] == a
    lo, hi = np.maximum(i - 1, 0), i
    dl, dh = a - NP_TABLE[lo], NP_TABLE[hi] - a
    code = np.where(dl < dh, lo, np.where(dh < dl, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(exact, i, code).astype(np.uint8)
    code = np.where(neg, code | 0x80, code).astype(np.uint8)
    return np.where(nan, 0x7F, code).astype(np.uint8)


def np_quantize_rows(x: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """1x32 along the last dim of a float32 (M, K) array -> (q bytes (M, K), s (M, K/32))."""
    m, k = x.shape
    blocks = x.astype(np.float64).reshape(m, k // 32, 32)
    s = np_scale(np.max(np.abs(blocks), axis=-1), mode)  # np.max propagates NaN
    scaled = np.ldexp(blocks, 127 - s.astype(np.int64)[..., None])
    q = np_e4m3(scaled)
    q = np.where((s == 255)[..., None], 0x7F, q).astype(np.uint8)
    return q.reshape(m, k), s


def rand_fp32_bits(rng: np.random.Generator, shape) -> np.ndarray:
    return rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32).view(np.float32)


# ------------------------------------------------------------------------------------------------
# Sanity of the independent oracles themselves
# ------------------------------------------------------------------------------------------------


def test_oracles_agree_with_each_other_and_torch_cast():
    rng = np.random.default_rng(0)
    v = np.concatenate(
        [
            rand_fp32_bits(rng, 4000).astype(np.float64),
            np.array(E4M3_TABLE) * 1.0000001,
            np.arange(0, 500, 0.25),
        ]
    )
    v = v[np.isfinite(v) | np.isnan(v)]
    scal = np.array([scalar_e4m3(float(t)) for t in v], dtype=np.uint8)
    np.testing.assert_array_equal(scal, np_e4m3(v))
    # torch's own cast (RNE) agrees inside the finite range once NaN is normalized
    finite = np.isfinite(v) & (np.abs(v) <= 448)
    t = torch.from_numpy(v[finite].astype(np.float32)).to(E4M3).view(torch.uint8).numpy()
    np.testing.assert_array_equal(t, np_e4m3(v[finite].astype(np.float32).astype(np.float64)))
    a = np.abs(rand_fp32_bits(rng, 4000))
    for mode in MODES:
        scal_s = np.array([scalar_scale(float(t), mode) for t in a], dtype=np.uint8)
        np.testing.assert_array_equal(scal_s, np_scale(a, mode))


# ------------------------------------------------------------------------------------------------
# SPEC table
# ------------------------------------------------------------------------------------------------

SPEC_CASES = [
    # (block max value, floor (s, q byte), rceil (s, q byte))
    ("zeros", 0.0, (0, 0x00), (0, 0x00)),
    ("2^-126", 2.0**-126, (0, 0x40), (0, 0x40)),
    ("inf", math.inf, (255, 0x7F), (255, 0x7F)),
    ("-inf", -math.inf, (255, 0x7F), (255, 0x7F)),
    ("nan", math.nan, (255, 0x7F), (255, 0x7F)),
    ("448", 448.0, (127, 0x7E), (127, 0x7E)),
    ("bf16max", BF16_MAX, (246, 0x7E), (247, 0x78)),
    ("480", 480.0, (127, 0x7E), (128, 0x77)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_spec_table_uniform_block(case, mode, dtype):
    _, value, floor_exp, rceil_exp = case
    s_exp, q_exp = floor_exp if mode == "floor" else rceil_exp
    x = torch.full((2, 64), value, dtype=torch.float32).to(dtype)
    q, s = ref.quantize_mxfp8_2d(x, scaling_mode=mode, blocked_scales=False)
    assert s.dtype == E8M0 and s.shape == (2, 2)
    assert q.dtype == E4M3 and q.shape == (2, 64)
    assert torch.all(u8(s) == s_exp)
    assert torch.all(u8(q) == q_exp)
    # the same block quantized along columns
    qc, sc = ref.quantize_mxfp8_2d(x.t().contiguous(), block="32x1", scaling_mode=mode, blocked_scales=False)
    assert torch.all(u8(sc) == s_exp) and torch.all(u8(qc) == q_exp)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("special", [math.inf, -math.inf, math.nan, "-nan"])
def test_block_containing_special_value(special, mode, dtype):
    x = torch.linspace(-3, 5, 96, dtype=torch.float32).view(1, 96)
    if special == "-nan":
        x[0, 40] = torch.tensor(0xFFC00000 - 2**32, dtype=torch.int32).view(torch.float32)
    else:
        x[0, 40] = special
    x = x.to(dtype)
    q, s = ref.quantize_mxfp8_2d(x, scaling_mode=mode, blocked_scales=False)
    assert u8(s).tolist() == [[u8(s)[0, 0].item(), 255, u8(s)[0, 2].item()]]
    assert torch.all(u8(q)[0, 32:64] == 0x7F)
    assert not torch.any(u8(q)[0, :32] == 0x7F) and not torch.any(u8(q)[0, 64:] == 0x7F)


@pytest.mark.parametrize("mode", MODES)
def test_signed_zero_and_negative_underflow(mode):
    x = torch.zeros(1, 32)
    x[0, 0] = 448.0
    x[0, 1] = -0.0
    x[0, 2] = -1e-30  # underflows to -0 in E4M3
    x[0, 3] = -448.0
    q, s = ref.quantize_mxfp8_2d(x, scaling_mode=mode, blocked_scales=False)
    assert u8(s).item() == 127
    assert u8(q)[0, :5].tolist() == [0x7E, 0x80, 0x80, 0xFE, 0x00]


def test_inverse_scale_bits():
    s = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    inv = ref.inverse_scale(s)
    for i in range(255):
        assert inv[i].item() == math.ldexp(1.0, 127 - i), i  # exact, including 2^-127 (subnormal)
    assert math.isnan(inv[255].item())
    assert torch.equal(ref.inverse_scale(s.view(E8M0)).view(torch.int32), inv.view(torch.int32))


def test_dequantize_roundtrip_of_representable_values():
    x = torch.tensor(E4M3_TABLE[95:127], dtype=torch.float32).view(1, 32) * 2.0**-20  # max 448 * 2^-20
    q, s = ref.quantize_mxfp8_2d(x, scaling_mode="floor", blocked_scales=False)
    back = ref.dequantize_blocks(q.view(1, 1, 32), s.view(1, 1))
    assert torch.equal(back.view(1, 32), x)


# ------------------------------------------------------------------------------------------------
# Numerics vs the independent implementations
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_scale_bits_all_bit_patterns_sampled(mode):
    rng = np.random.default_rng(1)
    a = np.abs(rand_fp32_bits(rng, 200_000))
    # the rceil edges: 448 * 2^e and its neighbours, and the subnormal d region
    edges = []
    for e in range(-160, 129):
        base = 448.0 * 2.0**e
        if base < 3.4e38:
            b = np.float32(base)
            edges += [b, np.nextafter(b, np.float32(0)), np.nextafter(b, np.float32(np.inf))]
    a = np.concatenate([a, np.array(edges, dtype=np.float32), np.float32([0, np.inf, np.nan, 2.0**-149])])
    got = ref.e8m0_scale_bits(torch.from_numpy(a.copy()), mode).numpy()
    np.testing.assert_array_equal(got, np_scale(a, mode))


def test_rceil_subnormal_d_boundary():
    # d = fp32(a / 448) rounds to exactly 2^-127 (mantissa 0x400000) -> s = 0; one ulp more -> s = 1
    a = torch.tensor([448.0 * 2.0**-127], dtype=torch.float32)
    d = a * torch.tensor(0x3B124925, dtype=torch.int32).view(torch.float32)
    assert d.view(torch.int32).item() == 0x00400000
    assert ref.e8m0_scale_bits(a, "rceil").item() == 0
    a2 = torch.nextafter(a, torch.tensor([1.0]))
    a3 = torch.nextafter(a2 * 1.00001, torch.tensor([1.0]))
    assert ref.e8m0_scale_bits(a3, "rceil").item() == scalar_scale(a3.item(), "rceil") == 1


@pytest.mark.parametrize("s_value", [0, 1, 2, 100, 120, 127, 134, 140, 200, 246, 253, 254])
def test_quantize_blocks_all_bf16_values(s_value):
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.bfloat16).float().view(-1, 32)
    s = torch.full((x.shape[0],), s_value, dtype=torch.uint8)
    got = u8(ref.quantize_blocks(x, s)).numpy().reshape(-1)
    want = np_e4m3(np.ldexp(x.numpy().astype(np.float64).reshape(-1), 127 - s_value))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", MODES)
def test_quantize_random_bit_patterns_vs_numpy(mode):
    rng = np.random.default_rng(2)
    x = rand_fp32_bits(rng, (256, 512))
    q, s = ref.quantize_mxfp8_2d(torch.from_numpy(x.copy()), scaling_mode=mode, blocked_scales=False)
    q_np, s_np = np_quantize_rows(x, mode)
    np.testing.assert_array_equal(u8(s).numpy(), s_np)
    np.testing.assert_array_equal(u8(q).numpy(), q_np)


def wide_range_blocks(rng: random.Random, nblocks: int) -> list[list[float]]:
    """Blocks whose magnitudes span 1e-30..1e30, with zeros, -0, ties and near-ties."""
    blocks = []
    for _ in range(nblocks):
        center = 10.0 ** rng.uniform(-30, 30)
        spread = rng.choice([1.0, 10.0, 1e3, 1e8])
        blk = []
        for _ in range(32):
            r = rng.random()
            if r < 0.05:
                v = rng.choice([0.0, -0.0])
            elif r < 0.15:  # an exact E4M3 grid point or midpoint at some power of two
                v = (
                    rng.choice([1, -1])
                    * (rng.randrange(0, 64) + rng.choice([0, 0.5]))
                    * 2.0 ** rng.randint(-6, 4)
                )
                v *= 2.0 ** round(math.log2(center))
            else:
                v = rng.choice([1, -1]) * center * 10.0 ** rng.uniform(-math.log10(spread), 0.3)
            blk.append(f32(v) if abs(v) < 3e38 else math.copysign(3e38, v))
        blocks.append([f32(v) for v in blk])
    return blocks


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_quantize_wide_range_vs_scalar(mode, dtype):
    rng = random.Random(3)
    blocks = wide_range_blocks(rng, 320)
    x = torch.tensor(blocks, dtype=torch.float32).view(40, 8 * 32).to(dtype)
    q, s = ref.quantize_mxfp8_2d(x, scaling_mode=mode, blocked_scales=False)
    xs = x.float().view(-1, 32).tolist()
    q_rows, s_rows = u8(q).view(-1, 32).tolist(), u8(s).view(-1).tolist()
    for i, blk in enumerate(xs):
        s_want, q_want = scalar_block(blk, mode)
        assert s_rows[i] == s_want, (i, blk)
        assert q_rows[i] == q_want, (i, blk)


@pytest.mark.parametrize("mode", MODES)
def test_quantize_subnormal_and_tiny_blocks_vs_scalar(mode):
    rng = random.Random(4)
    blocks = []
    for _ in range(64):
        top = rng.choice([2.0**-149, 2.0**-140, 2.0**-127, 448 * 2.0**-127, 2.0**-126, 1e-37, 1e-30])
        blocks.append([f32(rng.uniform(-1, 1) * top) for _ in range(31)] + [f32(top)])
    x = torch.tensor(blocks, dtype=torch.float32).view(16, 128)
    q, s = ref.quantize_mxfp8_2d(x, scaling_mode=mode, blocked_scales=False)
    for i, blk in enumerate(x.view(-1, 32).tolist()):
        s_want, q_want = scalar_block(blk, mode)
        assert u8(s).view(-1)[i].item() == s_want
        assert u8(q).view(-1, 32)[i].tolist() == q_want


# ------------------------------------------------------------------------------------------------
# Blocked layout
# ------------------------------------------------------------------------------------------------

SHAPES = [(1, 1), (5, 3), (32, 4), (128, 4), (129, 5), (300, 17), (256, 8), (33, 224), (1000, 2)]


def rand_scales(rows: int, cols: int, seed: int = 0, lead: tuple[int, ...] = ()) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 255, (*lead, rows, cols), generator=g, dtype=torch.uint8)


@pytest.mark.parametrize("shape", SHAPES)
def test_to_blocked_matches_torch_core(shape):
    s = rand_scales(*shape)
    rp, cp = 128 * math.ceil(shape[0] / 128), 4 * math.ceil(shape[1] / 4)
    ours = ref.to_blocked(s)
    assert ours.dtype == E8M0 and ours.shape == (rp, cp) and ours.is_contiguous()
    assert torch.equal(u8(ours).reshape(-1), torch_to_blocked(s))
    assert torch.equal(u8(ref.swizzle_scales(s.view(E8M0))).reshape(-1), torch_to_blocked(s))
    assert torch.equal(u8(ref.swizzle_scales(s)).reshape(-1), torch_to_blocked(s))


@pytest.mark.parametrize("shape", SHAPES)
def test_blocked_offsets_formula(shape):
    s = rand_scales(*shape, seed=1)
    off = ref.blocked_offsets(*shape)
    flat = u8(ref.to_blocked(s)).reshape(-1)
    assert torch.equal(flat[off], s)
    mask = torch.ones_like(flat, dtype=torch.bool)
    mask[off.reshape(-1)] = False
    assert torch.all(flat[mask] == 0)  # every padding byte written as 0
    # a few offsets spelled out from SPEC's formula by hand
    _, cp = ref.blocked_shape(*shape)
    for r, c in [(0, 0), (shape[0] - 1, shape[1] - 1), (shape[0] // 2, shape[1] // 2)]:
        want = ((r // 128) * (cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
        assert off[r, c].item() == want


@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 128, 4), (4, 130, 9), (1, 1, 1)])
def test_swizzle_3d_is_per_expert(shape):
    s = rand_scales(shape[1], shape[2], seed=2, lead=(shape[0],))
    out = ref.swizzle_scales(s.view(E8M0))
    rp, cp = ref.blocked_shape(shape[1], shape[2])
    assert out.shape == (shape[0], rp, cp) and out.dtype == E8M0
    for e in range(shape[0]):
        assert torch.equal(u8(out[e]).reshape(-1), torch_to_blocked(s[e]))


def expected_m_groups(s: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Compose the M-groups layout group by group with PyTorch core's to_blocked."""
    r, c = s.shape
    cp = 4 * math.ceil(c / 4)
    out = torch.zeros((r + 128 * len(sizes)) * cp, dtype=torch.uint8)
    start, p = 0, 0
    for n in sizes:
        if n:
            blk = torch_to_blocked(s[start : start + n])
            out[p * cp : p * cp + blk.numel()] = blk
        start += n
        p += 128 * math.ceil(n / 128)
    return out.view(r + 128 * len(sizes), cp)


def expected_k_groups(s: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    r, c = s.shape
    rp = 128 * math.ceil(r / 128)
    out = torch.zeros(rp * (c + 4 * len(sizes)), dtype=torch.uint8)
    start, q = 0, 0
    for k in sizes:
        if k:
            blk = torch_to_blocked(s[:, start : start + k])
            out[rp * q : rp * q + blk.numel()] = blk
        start += k
        q += 4 * math.ceil(k / 4)
    return out.view(rp, c + 4 * len(sizes))


GROUP_SIZES = [
    [5],
    [0],
    [1],
    [0, 0, 0],
    [44, 127, 129, 0, 1],
    [128, 128, 256],
    [0, 300, 0],
    [1] * 70,
]


@pytest.mark.parametrize("sizes", GROUP_SIZES)
@pytest.mark.parametrize("cols", [1, 3, 4, 7, 28])
@pytest.mark.parametrize("tail", [0, 37])
def test_swizzle_m_groups_vs_per_group(sizes, cols, tail):
    r = sum(sizes) + tail  # rows after the last group are not covered by any group
    s = rand_scales(r, cols, seed=len(sizes) + cols)
    out = ref.swizzle_scales(s.view(E8M0), group_end_offsets=offsets(sizes), groups="M")
    assert out.dtype == E8M0
    assert torch.equal(u8(out), expected_m_groups(s, sizes))


@pytest.mark.parametrize("sizes", GROUP_SIZES)
@pytest.mark.parametrize("rows", [1, 32, 128, 129, 300])
@pytest.mark.parametrize("tail", [0, 6])
def test_swizzle_k_groups_vs_per_group(sizes, rows, tail):
    c = sum(sizes) + tail
    s = rand_scales(rows, c, seed=rows + c)
    out = ref.swizzle_scales(s, group_end_offsets=offsets(sizes), groups="K")
    assert out.dtype == E8M0
    assert torch.equal(u8(out), expected_k_groups(s, sizes))


def test_swizzle_many_groups_random():
    rng = random.Random(5)
    for trial in range(3):
        sizes = [rng.choice([0, 1, rng.randrange(0, 300)]) for _ in range(300)]
        s = rand_scales(sum(sizes) + trial, 3 + trial, seed=trial)
        got = ref.swizzle_scales(s, group_end_offsets=offsets(sizes), groups="M")
        assert torch.equal(u8(got), expected_m_groups(s, sizes))
        ks = [rng.choice([0, 1, 3, 4, 5, 9]) for _ in range(300)]
        s = rand_scales(130, sum(ks) + trial, seed=trial + 10)
        got = ref.swizzle_scales(s, group_end_offsets=offsets(ks), groups="K")
        assert torch.equal(u8(got), expected_k_groups(s, ks))


def test_m_groups_zero_tail_past_last_group():
    s = rand_scales(200, 8, seed=6)
    out = u8(ref.swizzle_scales(s, group_end_offsets=offsets([3, 130]), groups="M")).reshape(-1)
    p_g = 128 + 256  # sum of the padded group blocks
    assert out.numel() == (200 + 256) * 8
    assert torch.all(out[p_g * 8 :] == 0)


def test_swizzle_rejects_bad_offset_values():
    s = rand_scales(10, 8)
    with pytest.raises(ValueError, match="non-decreasing"):
        ref.swizzle_scales(s, group_end_offsets=torch.tensor([5, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="<= the total"):
        ref.swizzle_scales(s, group_end_offsets=torch.tensor([11], dtype=torch.int32))
    with pytest.raises(ValueError, match="<= the total"):
        ref.swizzle_scales(s, group_end_offsets=torch.tensor([9], dtype=torch.int32), groups="K")
    with pytest.raises(ValueError, match=">= 0"):
        ref.swizzle_scales(s, group_end_offsets=torch.tensor([-1, 3], dtype=torch.int32))


def test_check_group_end_offsets():
    ok = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    ref.check_group_end_offsets(ok, 10)
    ref.check_group_end_offsets(ok, None)
    cases = [
        (torch.tensor([1, 2], dtype=torch.int64), 10, "int32"),
        ([1, 2], 10, "tensor"),
        (torch.tensor([[1, 2]], dtype=torch.int32), 10, "1-D"),
        (torch.tensor([], dtype=torch.int32), 10, "at least one group"),
        (torch.tensor([-3, 2], dtype=torch.int32), 10, ">= 0"),
        (torch.tensor([4, 2], dtype=torch.int32), 10, "non-decreasing"),
        (torch.tensor([4, 11], dtype=torch.int32), 10, "<= the total size"),
    ]
    for bad, total, msg in cases:
        with pytest.raises(ValueError, match=msg):
            ref.check_group_end_offsets(bad, total)
        with pytest.raises(ValueError, match="^swizzle_scales: group_end_offsets"):
            ref.check_group_end_offsets(bad, total, op="swizzle_scales")


def _offset_value_calls(ends: torch.Tensor) -> dict[str, object]:
    """``{op: call}``: every public op that takes group end offsets, called on the reference (CPU)
    with ``ends`` (the data has 64 rows)."""
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    s = torch.zeros(64, 2, dtype=torch.uint8)
    padded, start, _ = tb.pad_token_groups(x, torch.tensor([32, 64], dtype=torch.int32))
    h13 = torch.randn(64, 128, dtype=torch.bfloat16)
    q8 = torch.zeros(64, 64, dtype=torch.uint8).view(torch.float8_e4m3fn)
    return {
        "swizzle_scales": lambda: tb.swizzle_scales(s, group_end_offsets=ends),
        "quantize_mxfp8_2d": lambda: tb.quantize_mxfp8_2d(x, group_end_offsets=ends),
        "quantize_mxfp8_2d_dual": lambda: tb.quantize_mxfp8_2d_dual(x, group_end_offsets=ends),
        "pad_token_groups": lambda: tb.pad_token_groups(x, ends),
        "unpad_token_groups": lambda: tb.unpad_token_groups(padded, ends, start, num_tokens=64),
        "pad_and_quantize_mxfp8_2d": lambda: tb.pad_and_quantize_mxfp8_2d(x, ends),
        "quantize_fp8_2d": lambda: tb.quantize_fp8_2d(x, group_end_offsets=ends),
        "quantize_fp8_2d_dual": lambda: tb.quantize_fp8_2d_dual(x, group_end_offsets=ends),
        "pad_and_quantize_fp8_2d_cols": lambda: tb.pad_and_quantize_fp8_2d_cols(x, ends),
        "pad_and_quantize_fp8_2d_dual": lambda: tb.pad_and_quantize_fp8_2d_dual(x, ends),
        "swiglu_quantize_fp8": lambda: tb.swiglu_quantize_fp8(h13, group_end_offsets=ends),
        "swiglu_backward_quantize_fp8": lambda: tb.swiglu_backward_quantize_fp8(
            x, h13, group_end_offsets=ends
        ),
        "dequantize_fp8_rows": lambda: tb.dequantize_fp8_rows(q8, torch.ones(64), ends),
    }


@pytest.mark.parametrize("op", sorted(_offset_value_calls(torch.zeros(1, dtype=torch.int32))))
@pytest.mark.parametrize(
    ("ends", "what"), [([32, 0], "non-decreasing"), ([-32, 32], ">= 0"), ([32, 96], "<= the total")]
)
def test_offset_value_errors_name_the_op(op: str, ends: list[int], what: str) -> None:
    call = _offset_value_calls(torch.tensor(ends, dtype=torch.int32))[op]
    with pytest.raises(ValueError, match=f"^{op}: group_end_offsets.*{what}"):
        call()


# ------------------------------------------------------------------------------------------------
# Quantization layouts and op relations
# ------------------------------------------------------------------------------------------------


def rand_x(m: int, k: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-20, 20, (m, 1), generator=g).float())
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(32, 32), (64, 96), (160, 64), (96, 288)])
def test_32x1_equals_1x32_of_transpose(shape, mode, dtype):
    m, k = shape
    x = rand_x(m, k, dtype, seed=m + k)
    qc, sc = ref.quantize_mxfp8_2d(x, block="32x1", scaling_mode=mode, blocked_scales=False)
    qt, st = ref.quantize_mxfp8_2d(x.t().contiguous(), block="1x32", scaling_mode=mode, blocked_scales=False)
    assert qc.shape == (m, k) and qc.stride() == (1, m) and qc.dtype == E4M3
    assert sc.shape == (k, m // 32) and sc.is_contiguous() and sc.dtype == E8M0
    assert_bits_equal(qc.t(), qt)
    assert_bits_equal(sc, st)
    _, sb = ref.quantize_mxfp8_2d(x, block="32x1", scaling_mode=mode)
    assert_bits_equal(sb, ref.to_blocked(st))


@pytest.mark.parametrize("mode", MODES)
def test_1x32_blocked_scales(mode):
    x = rand_x(200, 160, torch.bfloat16, seed=7)
    q, s = ref.quantize_mxfp8_2d(x, scaling_mode=mode)
    q2, s2 = ref.quantize_mxfp8_2d(x, scaling_mode=mode, blocked_scales=False)
    assert q.shape == (200, 160) and q.is_contiguous()
    assert s.shape == (256, 8) and s2.shape == (200, 5)
    assert_bits_equal(q, q2)
    assert torch.equal(u8(s).reshape(-1), torch_to_blocked(u8(s2)))


@pytest.mark.parametrize("mode", MODES)
def test_grouped_quantize_equals_swizzle_of_unblocked(mode):
    x = rand_x(320, 96, torch.float32, seed=8)
    sizes = [32, 0, 96, 160]  # multiples of 32 so 32x1 accepts them too; 32 trailing rows
    offs = offsets(sizes)
    q, s = ref.quantize_mxfp8_2d(x, group_end_offsets=offs, scaling_mode=mode)
    _, su = ref.quantize_mxfp8_2d(x, scaling_mode=mode, blocked_scales=False)
    assert s.shape == (320 + 128 * 4, 4)
    assert torch.equal(u8(s), expected_m_groups(u8(su), sizes))
    qc, sc = ref.quantize_mxfp8_2d(x, block="32x1", group_end_offsets=offs, scaling_mode=mode)
    _, scu = ref.quantize_mxfp8_2d(x, block="32x1", scaling_mode=mode, blocked_scales=False)
    assert sc.shape == (128, 10 + 4 * 4)
    assert torch.equal(u8(sc), expected_k_groups(u8(scu), [n // 32 for n in sizes]))


def test_32x1_offsets_must_be_multiples_of_32():
    x = rand_x(64, 32, torch.float32)
    with pytest.raises(ValueError, match="^quantize_mxfp8_2d: group_end_offsets must be multiples of 32"):
        ref.quantize_mxfp8_2d(x, block="32x1", group_end_offsets=torch.tensor([16, 64], dtype=torch.int32))
    with pytest.raises(
        ValueError, match="^quantize_mxfp8_2d_dual: group_end_offsets must be multiples of 32"
    ):
        ref.quantize_mxfp8_2d_dual(x, group_end_offsets=torch.tensor([33, 64], dtype=torch.int32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("blocked", [True, False])
@pytest.mark.parametrize("with_offsets", [True, False])
def test_dual_equals_two_single_calls(dtype, blocked, with_offsets):
    if with_offsets and not blocked:
        pytest.skip("offsets need blocked scales")
    x = rand_x(96, 64, dtype, seed=9)
    offs = offsets([32, 0, 64]) if with_offsets else None
    for mode in MODES:
        out = ref.quantize_mxfp8_2d_dual(x, group_end_offsets=offs, scaling_mode=mode, blocked_scales=blocked)
        r = ref.quantize_mxfp8_2d(
            x, block="1x32", group_end_offsets=offs, scaling_mode=mode, blocked_scales=blocked
        )
        c = ref.quantize_mxfp8_2d(
            x, block="32x1", group_end_offsets=offs, scaling_mode=mode, blocked_scales=blocked
        )
        for got, want in zip(out, (*r, *c), strict=True):
            assert_bits_equal(got, want)
            assert got.stride() == want.stride()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", ["1x32", "32x1"])
@pytest.mark.parametrize("blocked", [True, False])
def test_3d_equals_per_expert_2d(dtype, block, blocked):
    e, n, k = 3, 160, 96
    w = torch.stack([rand_x(n, k, dtype, seed=10 + i) for i in range(e)]).contiguous()
    for mode in MODES:
        q, s = ref.quantize_mxfp8_3d(w, block=block, scaling_mode=mode, blocked_scales=blocked)
        assert q.shape == (e, n, k)
        assert q.stride() == ((n * k, k, 1) if block == "1x32" else (n * k, 1, n))
        srows, scols = (n, k // 32) if block == "1x32" else (k, n // 32)
        assert s.shape == ((e, *ref.blocked_shape(srows, scols)) if blocked else (e, srows, scols))
        for i in range(e):
            q2, s2 = ref.quantize_mxfp8_2d(w[i], block=block, scaling_mode=mode, blocked_scales=blocked)
            assert_bits_equal(q[i], q2)
            assert q[i].stride() == q2.stride()
            assert_bits_equal(s[i], s2)


def test_empty_inputs():
    q, s = ref.quantize_mxfp8_2d(torch.zeros(0, 64))
    assert q.shape == (0, 64) and s.shape == (0, 4)
    q, s = ref.quantize_mxfp8_2d(torch.zeros(0, 64), block="32x1", blocked_scales=False)
    assert q.shape == (0, 64) and s.shape == (64, 0)


# ------------------------------------------------------------------------------------------------
# Token-group padding
# ------------------------------------------------------------------------------------------------


def expected_pad(x: torch.Tensor, sizes: list[int], a: int):
    rows = a * math.ceil((x.shape[0] + len(sizes) * a) / a)
    bits = ref.BITS_DTYPES[x.element_size()]  # copy bits: some dtypes have no slice assignment
    out = torch.zeros(rows, x.shape[1], dtype=bits)
    ps, pe = [], []
    src, dst = 0, 0
    for n in sizes:
        out[dst : dst + n] = x[src : src + n].view(bits)
        ps.append(dst)
        dst += a * math.ceil(n / a)
        pe.append(dst)
        src += n
    return out.view(x.dtype), ps, pe


BYTE_COPY_DTYPES = [
    torch.bfloat16, torch.float32, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2, torch.int8,
    torch.uint8, torch.int32, torch.int64, torch.float64, torch.bool, torch.float8_e8m0fnu,
]  # fmt: skip


@pytest.mark.parametrize("alignment", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype", BYTE_COPY_DTYPES)
def test_pad_unpad_roundtrip(alignment, dtype):
    rng = random.Random(alignment)
    for trial in range(4):
        g = rng.choice([1, 2, 7, 64])
        sizes = [rng.choice([0, 1, alignment, alignment + 1, rng.randrange(0, 200)]) for _ in range(g)]
        tail = trial * 3
        x = random_bits((sum(sizes) + tail, 24), dtype, seed=trial)
        offs = offsets(sizes)
        padded, ps, pe = ref.pad_token_groups(x, offs, alignment=alignment)
        want, ps_want, pe_want = expected_pad(x, sizes, alignment)
        assert ps.dtype == pe.dtype == torch.int32
        assert ps.tolist() == ps_want and pe.tolist() == pe_want
        assert padded.shape == want.shape and padded.dtype == dtype
        assert_bits_equal(padded, want)  # includes: every row outside the groups is zero
        back = ref.unpad_token_groups(padded, offs, ps)
        assert_bits_equal(back, x[: sum(sizes)])


def test_pad_rows_outside_groups_are_zero():
    x = torch.ones(10, 8)
    padded, ps, pe = ref.pad_token_groups(x, offsets([3, 0, 7]), alignment=16)
    assert padded.shape == (16 * math.ceil((10 + 3 * 16) / 16), 8)
    assert ps.tolist() == [0, 16, 16] and pe.tolist() == [16, 16, 32]
    nonzero_rows = (padded != 0).any(dim=1).nonzero().view(-1).tolist()
    assert nonzero_rows == [0, 1, 2, *range(16, 23)]


def test_padded_group_offsets_helper():
    ps, pe = ref.padded_group_offsets(offsets([0, 1, 32, 33, 0]), 32)
    assert ps.tolist() == [0, 0, 32, 64, 128] and pe.tolist() == [0, 32, 64, 128, 128]
    assert ref.padded_rows(66, 5, 32) == 32 * math.ceil((66 + 5 * 32) / 32)


def test_unpad_without_num_tokens_rejects_a_garbage_last_offset():
    padded = torch.zeros(64, 4)
    for last in (65, 10**9, -1):
        with pytest.raises(ValueError, match=r"group_end_offsets\[-1\] = .* must be in \[0, 64\]"):
            checks.unpad_row_count(last, 64)
    with pytest.raises(ValueError, match=r"group_end_offsets\[-1\] = 70 must be in \[0, 64\]"):
        ref.unpad_token_groups(padded, offsets([10, 60]), torch.tensor([0, 4], dtype=torch.int32))


def test_3d_1x32_takes_any_n():
    w = torch.randn(3, 50, 64)
    q, s = ref.quantize_mxfp8_3d(w, block="1x32")
    assert q.shape == (3, 50, 64) and s.shape == (3, 128, 4)
    for e in range(3):
        q2, s2 = ref.quantize_mxfp8_2d(w[e], block="1x32")
        assert_bits_equal(q[e], q2)
        assert_bits_equal(s[e], s2)
    with pytest.raises(ValueError, match="for block='32x1'"):
        ref.quantize_mxfp8_3d(w, block="32x1")


def test_unpad_rejects_out_of_range_padded_start():
    padded = torch.zeros(64, 4)
    with pytest.raises(ValueError, match="padded_start"):
        ref.unpad_token_groups(padded, offsets([10, 20]), torch.tensor([0, 60], dtype=torch.int32))


@pytest.mark.parametrize("alignment", [16, 32, 64, 128])
@pytest.mark.parametrize("mode", MODES)
def test_pad_and_quantize_equals_quantize_of_pad(alignment, mode):
    rng = random.Random(alignment + len(mode))
    sizes = [rng.choice([0, 1, 5, 33, 130]) for _ in range(6)]
    x = rand_x(sum(sizes) + 3, 64, torch.bfloat16, seed=alignment)
    offs = offsets(sizes)
    q, s, ps, pe = ref.pad_and_quantize_mxfp8_2d(x, offs, alignment=alignment, scaling_mode=mode)
    padded, ps2, pe2 = ref.pad_token_groups(x, offs, alignment=alignment)
    q2, s2 = ref.quantize_mxfp8_2d(padded, group_end_offsets=pe2, scaling_mode=mode)
    assert torch.equal(ps, ps2) and torch.equal(pe, pe2)
    assert_bits_equal(q, q2)
    assert_bits_equal(s, s2)
    assert q.shape == (ref.padded_rows(x.shape[0], len(sizes), alignment), 64)
    assert s.shape == (q.shape[0] + 128 * len(sizes), 4)
    # data rows of padding are 0 and their scales are 0
    _, su = ref.quantize_mxfp8_2d(padded, scaling_mode=mode, blocked_scales=False)
    in_group = torch.zeros(q.shape[0], dtype=torch.bool)
    for start, n in zip(ps.tolist(), sizes, strict=True):
        in_group[start : start + n] = True
    assert torch.all(u8(q)[~in_group] == 0) and torch.all(u8(su)[~in_group] == 0)


# ------------------------------------------------------------------------------------------------
# Seeded property tests (random shapes and groups)
# ------------------------------------------------------------------------------------------------


def test_property_random_grouped_quantization():
    rng = random.Random(11)
    for _ in range(12):
        g = rng.randrange(1, 9)
        sizes = [32 * rng.choice([0, 1, 2, 5]) for _ in range(g)]
        m = sum(sizes) + 32 * rng.randrange(0, 3)
        if m == 0:
            continue
        k = 32 * rng.randrange(1, 6)
        dtype = rng.choice(DTYPES)
        mode = rng.choice(MODES)
        x = rand_x(m, k, dtype, seed=rng.randrange(1000))
        offs = offsets(sizes)
        qr, sr, qc, sc = ref.quantize_mxfp8_2d_dual(x, group_end_offsets=offs, scaling_mode=mode)
        _, sru, _, scu = ref.quantize_mxfp8_2d_dual(x, scaling_mode=mode, blocked_scales=False)
        assert torch.equal(u8(sr), expected_m_groups(u8(sru), sizes))
        assert torch.equal(u8(sc), expected_k_groups(u8(scu), [n // 32 for n in sizes]))
        q_np, s_np = np_quantize_rows(x.float().numpy(), mode)
        np.testing.assert_array_equal(u8(qr).numpy(), q_np)
        np.testing.assert_array_equal(u8(sru).numpy(), s_np)
        q_np, s_np = np_quantize_rows(x.float().t().contiguous().numpy(), mode)
        np.testing.assert_array_equal(u8(qc).t().numpy(), q_np)
        np.testing.assert_array_equal(u8(scu).numpy(), s_np)


def test_property_random_pad_roundtrip():
    rng = random.Random(12)
    for _ in range(20):
        a = rng.choice([16, 32, 64, 128])
        g = rng.randrange(1, 65)
        sizes = [rng.choice([0, 1, rng.randrange(0, 3 * a)]) for _ in range(g)]
        x = rand_x(sum(sizes) + rng.randrange(0, 5), rng.choice([1, 8, 32]), torch.float32, seed=g)
        padded, ps, _ = ref.pad_token_groups(x, offsets(sizes), alignment=a)
        want, _, _ = expected_pad(x, sizes, a)
        assert_bits_equal(padded, want)
        assert_bits_equal(ref.unpad_token_groups(padded, offsets(sizes), ps), x[: sum(sizes)])
