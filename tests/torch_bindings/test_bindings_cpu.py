"""The PyTorch layer on a machine without a GPU: backend choice, fake kernels, disk cache."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_bindings
from cute_kernels.op_specs import blocked_output_shape
from torch_bindings import kernel_cache, reference


def _scales(rows: int, cols: int) -> torch.Tensor:
    return torch.randint(0, 256, (rows, cols), dtype=torch.uint8).view(torch.float8_e8m0fnu)


def test_auto_runs_reference_on_cpu():
    scales = _scales(300, 7)
    ends = torch.tensor([3, 5, 7], dtype=torch.int32)
    out = torch_bindings.swizzle_scales(scales, group_end_offsets=ends, groups="K")
    expected = reference.swizzle_scales(scales, group_end_offsets=ends, groups="K")
    assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8))


def test_cute_backend_refuses_cpu_tensors():
    with pytest.raises(RuntimeError, match="backend='cute' cannot run here"):
        torch_bindings.swizzle_scales(_scales(4, 4), backend="cute")


def test_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        torch_bindings.swizzle_scales(_scales(4, 4), backend="triton")


def test_pending_kernels_run_reference_on_cpu():
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    q, s = torch_bindings.quantize_mxfp8_2d(x)
    q_ref, s_ref = reference.quantize_mxfp8_2d(x)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(s.view(torch.uint8), s_ref.view(torch.uint8))
    with pytest.raises(RuntimeError, match="cannot run here"):
        torch_bindings.quantize_mxfp8_2d(x, backend="cute")


@pytest.mark.parametrize(
    "shape,groups,num_groups,expected",
    [
        ((300, 7), "M", None, (384, 8)),
        ((2, 1, 1), "M", None, (2, 128, 4)),
        ((300, 7), "M", 5, (940, 8)),
        ((300, 7), "K", 5, (384, 27)),
    ],
)
def test_blocked_output_shape(shape, groups, num_groups, expected):
    assert blocked_output_shape(shape, num_groups, groups) == expected


def test_fake_implementation_shapes():
    with FakeTensorMode():
        scales = torch.empty(1000, 30, dtype=torch.float8_e8m0fnu)
        ends = torch.empty(6, dtype=torch.int32)
        out_m = torch.ops.cute_kernels.swizzle_scales(scales, ends, "M")
        out_k = torch.ops.cute_kernels.swizzle_scales(scales, ends, "K")
        out_plain = torch.ops.cute_kernels.swizzle_scales(scales, None, "M")
    assert out_m.shape == (1000 + 128 * 6, 32) and out_m.dtype == torch.float8_e8m0fnu
    assert out_k.shape == (1024, 30 + 4 * 6)
    assert out_plain.shape == (1024, 32)


def test_disk_cache_round_trip(tmp_path, monkeypatch):
    """Compile once, export; a cleared in-memory cache then loads the object file instead."""
    from cute_kernels import registry
    from cute_kernels.swizzle import SwizzleLayout, SwizzleVariant

    monkeypatch.setenv("CUTE_KERNELS_CACHE_DIR", str(tmp_path))
    key = ("test_disk_cache_round_trip", "sm_90a")

    def build():
        return registry.entry("swizzle").compile(SwizzleVariant(SwizzleLayout.PLAIN), "sm_90a")

    compiles, loads = kernel_cache.STATS.compiles, kernel_cache.STATS.disk_loads
    kernel_cache.get_kernel(key, build)
    assert kernel_cache.STATS.compiles == compiles + 1
    assert len(list(tmp_path.glob("*.o"))) == 1
    assert kernel_cache.get_kernel(key, build) is not None  # in-memory hit
    kernel_cache.clear_memory_cache()
    loaded = kernel_cache.get_kernel(key, build)
    assert kernel_cache.STATS.compiles == compiles + 1
    assert kernel_cache.STATS.disk_loads == loads + 1
    # The loaded TVM-FFI function carries the compiled signature (src, dst, offsets, num_sms): a
    # wrong call is a clear error.
    with pytest.raises(TypeError, match="Expects 4 parameters"):
        loaded(torch.zeros(1, 1, 1, dtype=torch.uint8))


@pytest.mark.parametrize(
    "rows,cols", [(131072, 64), (131072, 160), (7168, 4096), (262144, 256), (524288, 224)]
)
def test_swizzle_wide_window_rule_matches_kernel_module(rows, cols):
    from cute_kernels.swizzle import SwizzleLayout, wide_window
    from torch_bindings.swizzle import wide_window as binding_rule

    for layout in (SwizzleLayout.M_GROUPS, SwizzleLayout.K_GROUPS):
        assert binding_rule(rows, cols) == wide_window(layout, rows, cols)
    assert not wide_window(SwizzleLayout.PLAIN, rows, cols)


@pytest.mark.parametrize("rows,wide", [(262144, True), (262148, False)])
def test_swizzle_launcher_window_at_the_size_cap(rows, wide):
    """The launcher's inlined window rule flips where ``wide_window`` does: at 64 MiB of grouped
    scales (256 columns)."""
    from torch_bindings import swizzle as binding

    chosen = []

    class Target:
        arch, num_sms, kernels = "sm_90a", 132, {}

        def kernel(self, key, variant_of):
            chosen.append(variant_of(key, self))
            return lambda *args: None

    scales = torch.empty(rows, 256, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    binding._run_kernel(Target(), scales, torch.tensor([rows], dtype=torch.int32), "M")
    assert binding.wide_window(rows, 256) is wide
    assert chosen[0].wide is wide


def test_swizzle_full_path_launches_through_its_launcher():
    """The full path sends what the checks accept to the launcher (uint8 scales, offsets that
    subclass Tensor as plain tensors, M groups of no rows) and allocates the outputs that launch
    nothing (M groups with no columns, K groups with no rows, empty plain scales) itself."""
    from torch_bindings import swizzle as binding

    launched = []

    class Target:
        arch, num_sms, kernels = "sm_90a", 132, {}

        def kernel(self, key, variant_of):
            return lambda *args: launched.append(args)

    ends = torch.nn.Parameter(torch.tensor([0, 5], dtype=torch.int32), requires_grad=False)
    cases = [  # (scales shape, groups, offsets, output shape, launches)
        ((5, 7), "M", ends, (261, 8), True),
        ((0, 7), "M", ends, (256, 8), True),
        ((5, 0), "M", ends, (261, 0), False),
        ((5, 7), "K", ends, (128, 15), True),
        ((5, 0), "K", ends, (128, 8), True),
        ((0, 7), "K", ends, (0, 15), False),
        ((5, 7), "M", None, (128, 8), True),
        ((2, 0, 7), "M", None, (2, 0, 8), False),
    ]
    for dtype in (torch.uint8, torch.float8_e8m0fnu):
        for shape, groups, offsets, out_shape, launches in cases:
            launched.clear()
            scales = torch.zeros(shape, dtype=torch.uint8).view(dtype)
            out = binding._run_kernel(Target(), scales, offsets, groups)
            assert out.shape == out_shape and out.dtype == torch.float8_e8m0fnu, shape
            assert len(launched) == launches, shape
            if launches:  # the kernel reads E8M0 and writes the output it returns
                assert launched[0][0].dtype == torch.float8_e8m0fnu and launched[0][1] is out, shape
            if launches and offsets is not None:
                assert type(launched[0][2]) is torch.Tensor


def test_swizzle_kernel_choice():
    """The binding's variant, over shapes x base offsets x layouts: always a built variant the kernel
    can implement there (``SwizzleKernel.can_implement``), launched with the device's SM count; word
    loads only for whole, aligned words; the raw (non-ragged) form only for sources ending on a
    word; the form depends on the static dim and the base, never on M (rows of plain / M-groups,
    columns of K-groups)."""
    from cute_kernels.swizzle import SwizzleKernel, SwizzleLayout
    from torch_bindings import swizzle as binding

    built = set(SwizzleKernel.variants())

    class Target:
        arch, num_sms = "sm_90a", 132
        kernels: dict = {}  # nothing compiled yet: every call takes kernel()

        def kernel(self, key, variant_of):
            assert key[0] == "swizzle"
            return lambda *args: chosen.append((variant_of(key, self), args))

    base = torch.zeros(1 << 21, dtype=torch.uint8)
    for (rows, cols), skew, groups in itertools.product(
        [(1, 1), (17, 5), (100, 8), (129, 161), (300, 40), (4099, 90), (64, 224)], range(4), [None, "M", "K"]
    ):
        for dims in ((rows, cols), (3, rows, cols)) if groups is None else ((rows, cols),):
            n = math.prod(dims)
            scales = base[skew : skew + n].view(dims)
            ends = (
                None
                if groups is None
                else torch.tensor([dims[-2] if groups == "M" else cols], dtype=torch.int32)
            )
            chosen = []
            binding._run_kernel(Target(), scales, ends, groups or "M")
            (variant, args), *_ = chosen
            assert variant in built, chosen
            assert args[-1] == Target.num_sms
            assert SwizzleKernel.can_implement(variant, dims, scales.data_ptr(), 0 if ends is None else 1)
            assert variant.wide == (groups is not None and binding.wide_window(rows, cols))
            if variant.word_loads:
                assert cols % 4 == 0 and skew == 0
            elif not variant.ragged_end:
                assert (skew + n) % 4 == 0 and variant.layout is SwizzleLayout.K_GROUPS
                assert rows % 4 == 0 and skew == 0
            if variant.layout is not SwizzleLayout.K_GROUPS and not variant.word_loads:
                assert variant.ragged_end  # whatever M is


@pytest.mark.parametrize("groups", [1, 64, 65, 2048])
def test_grouped_1x32_keys_hold_their_groups(groups):
    """The M-groups quantization and pad+quantize key the same group capacity: the variant with
    small scan arrays while G fits it, else the full one; never fewer than G."""
    from cute_utils.constants import MAX_GROUPS, SMALL_GROUPS
    from torch_bindings import pad_quantize, quantize

    keys = []

    class Target:
        arch, num_sms, kernels = "sm_90a", 132, {}
        e4m3 = torch.empty(0, dtype=torch.float8_e4m3fn)
        e8m0 = torch.empty(0, dtype=torch.float8_e8m0fnu)

        def kernel(self, key, variant_of):
            keys.append(key)
            return lambda *args: None

    x = torch.zeros(64, 64, dtype=torch.bfloat16)
    ends = torch.full((groups,), 64, dtype=torch.int32)
    quantize.launch_1x32_2d(Target(), x, x.shape, ends, groups, "rceil", True)
    pad_quantize._launch(Target(), x, x.shape, ends, groups, 32, "rceil")
    capacity = SMALL_GROUPS if groups <= SMALL_GROUPS else MAX_GROUPS
    assert [key.max_groups for key in keys] == [capacity, capacity] and capacity >= groups


@pytest.mark.parametrize(
    "dtype,rows,cols,offset,row_stride",
    [
        (torch.bfloat16, 4, 7168, 0, None),
        (torch.bfloat16, 4, 8, 1, None),  # pointer 2 bytes past a boundary
        (torch.bfloat16, 4, 6, 0, None),
        (torch.bfloat16, 4, 7, 0, None),
        (torch.float32, 4, 3, 0, None),
        (torch.float32, 4, 4, 0, None),
        (torch.float8_e4m3fn, 4, 5, 0, None),
        (torch.float8_e4m3fn, 4, 4, 0, None),
        (torch.int64, 4, 3, 0, None),
        (torch.float64, 4, 2, 0, None),
        (torch.uint16, 4, 8, 0, None),  # a carrier dtype (viewed as int16)
        (torch.bfloat16, 0, 8, 0, 3),  # no rows: the row stride is free (contiguous all the same)
        (torch.bfloat16, 0, 8, 0, 8),
    ],
)
def test_unpad_launcher_keeps_the_vector_rule(dtype, rows, cols, offset, row_stride):
    """Unpad's launcher (its fast path, with the vector rule written inline) launches the kernel
    ``_gather`` picks, with padded as that kernel takes it and a (num_tokens, D) output."""
    from torch_bindings import pad as pad_bindings

    launched = []

    class Target:
        arch, num_sms, kernels = "sm_90a", 132, {}

        def kernel(self, key, variant_of):
            return lambda *args: launched.append((key, args))

    base = torch.zeros(1 << 17, dtype=torch.uint8).view(dtype)
    if row_stride is None:
        padded = base[offset : offset + rows * cols].view(rows, cols)
    else:
        padded = base.as_strided((rows, cols), (row_stride, 1), offset)
    assert padded.is_contiguous()
    operand = pad_bindings.operand_of(padded)
    ends = start = torch.zeros(2, dtype=torch.int32)
    out = pad_bindings._fast_unpad(Target(), (padded, ends, start, 5))
    data, key = pad_bindings._gather("unpad", padded, rows, cols, operand)
    ((launched_key, args),) = launched
    assert launched_key == key and args[0].dtype == data.dtype and args[2:] == (ends, start)
    assert out.shape == (5, cols) and out.dtype == dtype


def test_unpad_full_path_launches_through_its_launcher():
    """The full path sends what the checks accept to the launcher in a form it takes (row count
    read from the offsets, an int count, offsets that subclass Tensor as plain tensors), and
    allocates an empty output without a launch."""
    from torch_bindings import pad as pad_bindings

    launched = []

    class Target:
        arch, num_sms, kernels = "sm_90a", 132, {}

        def kernel(self, key, variant_of):
            return lambda *args: launched.append(args)

    padded = torch.zeros(64, 16, dtype=torch.int8)
    ends = torch.nn.Parameter(torch.tensor([3, 40], dtype=torch.int32), requires_grad=False)
    start = torch.nn.Parameter(torch.tensor([0, 32], dtype=torch.int32), requires_grad=False)
    for num_tokens, rows in ((None, 40), (50, 50), (0, 0)):
        out = pad_bindings._run_unpad(Target(), padded, ends, start, num_tokens)
        assert out.shape == (rows, 16) and out.dtype == torch.int8
    assert len(launched) == 2 and all(type(t) is torch.Tensor for args in launched for t in args[2:])
    assert pad_bindings._run_unpad(Target(), padded[:, :0], ends, start, 7).shape == (7, 0)
    assert len(launched) == 2
    # a dtype the fast path has not seen (a carrier view) and a Parameter padded
    pad_bindings._OPERANDS.pop(torch.uint32, None)
    for data in (torch.zeros(64, 16, dtype=torch.uint32), torch.nn.Parameter(torch.zeros(64, 16), False)):
        out = pad_bindings._run_unpad(Target(), data, ends, start, 50)
        assert out.shape == (50, 16) and out.dtype == data.dtype
    assert launched[2][0].dtype == torch.int32 and len(launched) == 4
    with pytest.raises(ValueError, match="num_tokens must be >= 0"):
        pad_bindings._run_unpad(Target(), padded, ends, start, -3)  # e.g. a negative SymInt


def test_swizzle_can_implement_limits():
    """``SwizzleKernel.can_implement``: the group count (1 to ``cute_utils.constants.MAX_GROUPS``,
    none for plain), the rank, word loads on whole aligned words, a raw source ending on a word."""
    from cute_kernels.swizzle import SwizzleKernel, SwizzleLayout, SwizzleVariant
    from cute_utils.constants import MAX_GROUPS

    can = SwizzleKernel.can_implement
    m_groups = SwizzleVariant(SwizzleLayout.M_GROUPS, word_loads=True)
    assert can(m_groups, (256, 8), 0, MAX_GROUPS) and not can(m_groups, (256, 8), 0, MAX_GROUPS + 1)
    assert not can(m_groups, (256, 8), 0, 0) and not can(m_groups, (256, 7), 0, 1)
    assert not can(m_groups, (256, 8), 2, 1)
    plain = SwizzleVariant(SwizzleLayout.PLAIN)
    assert not can(plain, (256, 8), 0, 1) and not can(plain, (2, 256, 8), 0)
    assert can(plain, (256, 8), 0) and not can(plain, (255, 7), 0)
    assert can(SwizzleVariant(SwizzleLayout.PLAIN, 3, ragged_end=True), (3, 255, 7), 1)
    with pytest.raises(ValueError, match="word loads"):
        SwizzleVariant(SwizzleLayout.K_GROUPS, word_loads=True)
    with pytest.raises(ValueError, match="2-D"):
        SwizzleVariant(SwizzleLayout.M_GROUPS, 3)


def test_cpu_demo_checks_the_contract(capsys):
    """make demo without a GPU: reference run, checks against the SPEC table and PyTorch's
    to_blocked, a few kernels' SASS lines; exit status 0 and a short output."""
    from bench import demo

    assert demo.cpu_demo() == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and out.count(" ok ") >= 8
    assert len(out.splitlines()) < 40


def test_torch_compile_on_cpu_runs_the_reference_outside_the_graph():
    """Compiling an op is a GPU feature: on CPU the reference (float8_e8m0fnu outputs and
    data-dependent offset checks Inductor cannot compile) runs eagerly in a graph break, with the
    eager bytes; ``fullgraph=True`` raises dynamo's error carrying the op's reason (torch_bindings/op.py)."""
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    ends = torch.tensor([32, 64], dtype=torch.int32)

    def grouped(x, ends):
        return torch_bindings.quantize_mxfp8_2d(x, group_end_offsets=ends)

    q, s = torch.compile(grouped)(x, ends)
    q_eager, s_eager = grouped(x, ends)
    assert torch.equal(q.view(torch.uint8), q_eager.view(torch.uint8))
    assert torch.equal(s.view(torch.uint8), s_eager.view(torch.uint8))

    def grouped_fullgraph(x, ends):
        return torch_bindings.quantize_mxfp8_2d(x, group_end_offsets=ends)

    with pytest.raises(
        torch._dynamo.exc.Unsupported, match="quantize_mxfp8_2d: torch.compile .* GPU feature"
    ):
        torch.compile(grouped_fullgraph, fullgraph=True)(x, ends)
