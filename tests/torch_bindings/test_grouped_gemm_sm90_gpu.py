"""The sm_90a FP8 grouped GEMM (``cute_kernels.grouped_gemm_sm90``) on an sm_90 GPU, against the fp32
reference (``reference.grouped_gemm_fp8_rowwise_reference``, the same operands): SQNR at least
torch._scaled_grouped_mm's on the same operands, bytes equal run to run, a fuzz of group patterns
(empty first / last, runs of empties, one-row groups, all rows in one group, sizes around the
128-row tile) on poisoned memory (2d3d: the rows past the last end stay unwritten), the same bytes
from the one-CTA and the two-CTA cluster builds, and no host sync (notes/grouped-gemm-sm90.md)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_bytes, cuda_offsets, no_sync

from torch_bindings import reference

pytestmark = pytest.mark.gpu

POISON = 0xA5
PATTERNS = {
    "ragged": (100, 100, 357, 612, 1000),
    "empty first and last": (0, 300, 777, 1000, 1000),
    "runs of empties": (0, 0, 0, 129, 129, 129, 130, 1000),
    "one-row groups": (1, 2, 3, 4, 1000),
    "all in one": (1000,),
    "around the tile": (127, 255, 384, 513, 640, 768, 1000),
    "last end below M": (64, 500, 900),
}


def _sm90() -> None:
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the grouped GEMM is sm_90a only")


def _sqnr_db(actual: torch.Tensor, expected: torch.Tensor) -> float:
    noise = (actual.float() - expected.float()).norm()
    return float(20 * torch.log10(expected.float().norm() / noise.clamp(min=1e-30)))


def _operands(form: str, m: int, n: int, k: int, ends, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    offsets = cuda_offsets(ends)
    if form == "2d3d":
        x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
        w = (torch.randn(len(ends), n, k, device="cuda", generator=gen) * 0.05).to(torch.bfloat16)
        q, s = reference.quantize_fp8_2d(x, axis="row")
        q_w, s_w = reference.quantize_fp8_3d(w, axis="K")
        return (q, q_w, s, s_w, offsets), (q, q_w.transpose(-2, -1), s, s_w, offsets)
    gy = torch.randn(m, n, device="cuda", generator=gen).to(torch.bfloat16)
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    q_gy, s_gy = reference.quantize_fp8_2d(gy, axis="col", group_end_offsets=offsets)
    q_x, s_x = reference.quantize_fp8_2d(x, axis="col", group_end_offsets=offsets)
    return (q_gy.t(), q_x.t(), s_gy, s_x, offsets), (q_gy.t(), q_x, s_gy, s_x, offsets)


def _run(form: str, args, poison) -> torch.Tensor:
    """The kernel into an output of POISON bytes. The output is passed in, not left to the caching
    allocator: outputs under 1 MiB come from its small-block pool, which ``poison`` does not reach,
    so their unwritten rows would hold stale data rather than POISON."""
    from torch_bindings.grouped_gemm_sm90 import grouped_gemm_fp8_rowwise_sm90

    out = _poisoned_out(form, args, poison)
    with no_sync():
        return grouped_gemm_fp8_rowwise_sm90(form, *args, out=out)


def _poisoned_out(form: str, args, poison) -> torch.Tensor:
    """The bf16 output of ``form`` for ``args``, every byte POISON (after ``poison``)."""
    a, b, offsets = args[0], args[1], args[4]
    shape = (a.shape[0], b.shape[1]) if form == "2d3d" else (offsets.shape[0], a.shape[0], b.shape[0])
    poison()
    out = torch.full((*shape[:-1], 2 * shape[-1]), POISON, dtype=torch.uint8, device="cuda")
    return out.view(torch.bfloat16)


def _valid(form: str, out: torch.Tensor, ends) -> torch.Tensor:
    return out[: max(0, min(ends[-1], out.shape[0]))] if form == "2d3d" else out


@pytest.mark.parametrize("form", ["2d3d", "2d2d"])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_fuzz_matches_fp32_math(form, name, poison_cuda_allocator):
    _sm90()
    ends = PATTERNS[name]
    ours_args, _ = _operands(form, 1008, 320, 384, ends)
    out = _run(form, ours_args, poison_cuda_allocator)
    expected = reference.grouped_gemm_fp8_rowwise_reference(form, *ours_args)
    got, want = _valid(form, out, ends), _valid(form, expected, ends)
    assert not torch.isnan(got.float()).any()
    assert _sqnr_db(got, want) >= 40, name
    if form == "2d3d" and ends[-1] < out.shape[0]:
        assert (out[ends[-1] :].view(torch.uint8) == POISON).all(), "rows past the last end unwritten"


@pytest.mark.parametrize("form", ["2d3d", "2d2d"])
def test_sqnr_at_least_torch(form, poison_cuda_allocator):
    """Both GEMMs on the same operands (groups of 16 rows for torch's 2d2d), scored against fp32."""
    _sm90()
    ends = (512, 512, 1024, 2048, 2304, 4096)
    ours_args, torch_args = _operands(form, 4096, 1024, 2048, ends, seed=3)
    expected = reference.grouped_gemm_fp8_rowwise_reference(form, *ours_args)
    ours = _run(form, ours_args, poison_cuda_allocator)
    theirs = torch._scaled_grouped_mm(*torch_args, out_dtype=torch.bfloat16, use_fast_accum=True)
    assert _sqnr_db(ours, expected) >= _sqnr_db(theirs, expected) - 0.1


@pytest.mark.parametrize("form", ["2d3d", "2d2d"])
def test_deterministic_bytes(form, poison_cuda_allocator):
    _sm90()
    ends = PATTERNS["around the tile"]
    args, _ = _operands(form, 1008, 256, 512, ends, seed=5)
    first = _run(form, args, poison_cuda_allocator)
    second = _run(form, args, poison_cuda_allocator)
    assert_same_bytes(_valid(form, second, ends), _valid(form, first, ends), form)


@pytest.mark.parametrize("form", ["2d3d", "2d2d"])
def test_nan_rows_past_the_last_end_stay_out(form, poison_cuda_allocator):
    """Rows of M past the last end hold NaN (e4m3 0x7F) in every operand: TMA loads them into the
    last group's boxes (they lie inside the tensors), and they must not reach a stored output. 2d2d:
    the tail masking zeroes them in both operands (a NaN in either would give 0 x NaN); its group
    sizes end mid-chunk and on rows of every residue mod 8, where a wrong swizzle shows."""
    _sm90()
    ends = (100, 100, 357, 1000)
    args, _ = _operands(form, 1008, 320, 384, ends, seed=7)
    a, b = args[0].view(torch.uint8), args[1].view(torch.uint8)
    if form == "2d3d":
        a[1000:] = 0x7F
    else:
        a[:, 1000:] = 0x7F
        b[:, 1000:] = 0x7F
    out = _run(form, args, poison_cuda_allocator)
    expected = reference.grouped_gemm_fp8_rowwise_reference(form, *args)
    got, want = _valid(form, out, ends), _valid(form, expected, ends)
    assert not torch.isnan(got.float()).any()
    assert _sqnr_db(got, want) >= 40


GARBAGE = {
    "negative": (-5, 300, -1000, 1000),
    "decreasing": (900, 400, 700, 100),
    "past the end": (300, 5000, 2**31 - 1, 2**31 - 1),
    "int min": (-(2**31), 500, -(2**31), 1000),
}


@pytest.mark.parametrize("form", ["2d3d", "2d2d"])
@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_offsets_stay_in_bounds(form, name, poison_cuda_allocator):
    """Offsets no validator checked (SPEC section 5): the kernel clamps every group to the tensor,
    never reads or writes out of bounds (run under compute-sanitizer memcheck by
    tests/support/sanitize.sh), writes no NaN from the poisoned memory, and returns."""
    _sm90()
    args, _ = _operands(form, 1008, 256, 384, (250, 500, 750, 1000), seed=9)
    args = (*args[:4], cuda_offsets(GARBAGE[name]))
    out = _run(form, args, poison_cuda_allocator)
    torch.cuda.synchronize()
    assert out.shape == ((1008, 256) if form == "2d3d" else (4, 256, 384))


@pytest.mark.parametrize("form", ["2d3d", "2d2d"])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_cluster_of_two_writes_the_same_bytes(form, name, poison_cuda_allocator):
    """The ``cluster=2`` build (the default: a shared operand's boxes multicast to two CTAs) writes
    the bytes of the ``cluster=1`` build, on every fuzz pattern. Three tile blocks along the paired
    dimension (2d3d: N = 576 is three column blocks; 2d2d: N = 320 three row blocks), so one
    cluster's second tile lies past the output: it still loads its half of the shared box and
    stores nothing (2d3d: rows past the last end stay POISON)."""
    from dataclasses import replace

    from cute_kernels import registry
    from cute_kernels.grouped_gemm_sm90 import GroupedGemmSm90Kernel, GroupedGemmVariant
    from torch_bindings import backend

    _sm90()
    ends = PATTERNS[name]
    args, _ = _operands(form, 1008, 576 if form == "2d3d" else 320, 384, ends, seed=11)
    variant = GroupedGemmVariant(form)
    base = GroupedGemmSm90Kernel.default_config(variant, "sm_90a")
    entry = registry.entry("grouped_gemm_sm90")
    outs = []
    for cluster in (1, 2):
        kernel = entry.compile(variant, "sm_90a", config=replace(base, cluster=cluster))
        out = _poisoned_out(form, args, poison_cuda_allocator)
        with no_sync():
            kernel(*args, out, backend.num_sms(torch.cuda.current_device()))
        outs.append(_valid(form, out, ends))
        if form == "2d3d" and ends[-1] < out.shape[0]:
            assert (out[ends[-1] :].view(torch.uint8) == POISON).all(), "rows past the last end unwritten"
    assert_same_bytes(outs[1], outs[0], f"{form} {name}")
