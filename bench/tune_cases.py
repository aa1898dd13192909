"""The shapes ``python -m bench.tune KERNEL`` times, one function per KERNEL: ``name(args, device)
-> [bench.common.tuning.Case]`` (argument sets as the bindings allocate them, the launch, the
tensors written, bytes moved, the shape class and the reference bytes where there is one).
Needs a GPU; the config spaces are in ``cute_kernels.configs.spaces``."""

from __future__ import annotations

import argparse
import itertools

import torch

from bench.common.groups import block_group_ends, skewed_group_ends
from bench.common.tuning import Case


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def swizzle(args: argparse.Namespace, device: torch.device) -> list[Case]:
    """E8M0 scales of 16-120 MB, aligned (word loads) and unaligned rows, uneven groups with a few
    empty ones; the variant as ``torch_bindings.swizzle`` picks it."""
    from cute_kernels.op_specs import blocked_output_shape
    from cute_kernels.swizzle import SwizzleLayout, SwizzleVariant
    from torch_bindings.backend import num_sms

    shapes = {
        "plain": [((65536, 160), 0), ((131072, 224), 0), ((524288, 224), 0), ((131001, 226), 0)],
        "m_groups": [((65536, 160), 8), ((131072, 64), 8), ((131072, 160), 8), ((131072, 224), 64)]
        + [((131072, 226), 8), ((524288, 224), 8)],
        "k_groups": [((5120, 4096), 8), ((7168, 4096), 8), ((2048, 16384), 8), ((7168, 16384), 8)],
    }
    sms = num_sms(device.index)
    cases = []
    for name, per_layout in shapes.items():
        if args.layouts and name not in args.layouts:
            continue
        layout = SwizzleLayout(name)
        for shape, groups in per_layout[:2] if args.quick else per_layout:
            word_loads = layout is not SwizzleLayout.K_GROUPS and shape[1] % 4 == 0
            ragged = not word_loads and (layout is not SwizzleLayout.K_GROUPS or shape[0] % 4 != 0)
            along_k = layout is SwizzleLayout.K_GROUPS
            ends = _uneven_ends(shape[1] if along_k else shape[0], groups, device) if groups else None
            out_shape = blocked_output_shape(shape, groups or None, "K" if along_k else "M")

            def make(shape=shape, out_shape=out_shape):
                scales = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
                return scales.view(torch.float8_e8m0fnu), torch.empty(
                    out_shape, dtype=torch.float8_e8m0fnu, device=device
                )

            moved = torch.Size(shape).numel() + torch.Size(out_shape).numel()
            cases.append(
                Case(
                    f"{name} {shape} G={groups}",
                    ("swizzle",),
                    SwizzleVariant(layout, 2, word_loads, ragged_end=ragged),
                    make,
                    lambda _, k, s, o, e=ends: k(s, o, e, sms),
                    lambda _, a: (a[1],),
                    lambda _, n=moved: n,
                )
            )
    return cases


def _uneven_ends(total: int, groups: int, device: torch.device) -> torch.Tensor:
    """Uneven, unaligned end offsets (a few empty groups) over ``total``."""
    weights = torch.arange(1, groups + 1, dtype=torch.float64) ** 1.5
    weights[1::5] = 0
    ends = (weights.cumsum(0) / weights.sum() * total).floor().to(torch.int32)
    ends[-1] = total - 3
    return ends.to(device)


def _quantize_sets(shape, dtype, groups: int, device: torch.device):
    """``make`` of the 1x32 kernel's (x, q, blocked scales, ends or None): ``groups`` unaligned
    row groups (M-groups scales) or none."""
    from cute_kernels.op_specs import scales_shape_1x32

    rows = shape[0]
    ends = None
    if groups:
        ends = (torch.arange(1, groups + 1, device=device) * rows // groups - 37).clamp(min=0).to(torch.int32)
        ends[-1] = rows

    def make():
        x = torch.randn(shape, dtype=dtype, device=device)
        q = torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)
        s = torch.empty(scales_shape_1x32(shape, groups or None, True), dtype=torch.uint8, device=device)
        return x, q, s.view(torch.float8_e8m0fnu), ends

    return make


def quantize_1x32(args: argparse.Namespace, device: torch.device) -> list[Case]:
    """bf16 (``--dtype``) blocked and 8 M-groups; ``--space padded``: the fused-padding variant
    (A = 32) on seed 000's shapes."""
    from cute_kernels.quantize import Quantize1x32Variant, ScaleLayout

    if args.space == "padded":
        return _padded_1x32(device)
    dtype = getattr(torch, args.dtype)
    shapes = [(8192, 2048), (8192, 7168), (32768, 2048), (32768, 7168), (131072, 7168)]
    cases = []
    for shape, grouped in itertools.product(shapes[:2] if args.quick else shapes, (False, True)):
        layout = ScaleLayout.M_GROUPS if grouped else ScaleLayout.BLOCKED
        make = _quantize_sets(shape, dtype, 8 if grouped else 0, device)
        moved = _nbytes(make()[:3])
        cases.append(
            Case(
                f"{shape} {layout.value}",
                ("quantize_1x32",),
                Quantize1x32Variant(args.dtype, "rceil", layout, 64),
                make,
                lambda _, k, x, q, s, e: k(x, q, s, e, None, None, 0),
                lambda _, a: a[1:3],
                lambda _, n=moved: n,
            )
        )
    return cases


def _padded_1x32(device: torch.device) -> list[Case]:
    from cute_kernels.quantize import Quantize1x32Variant, ScaleLayout
    from torch_bindings.contract import PAD_AND_QUANTIZE_MXFP8_2D

    cases = []
    for shape, groups in (((16384, 1536), 16), ((16384, 2048), 8), ((16384, 2048), 16), ((16384, 7168), 16)):
        ends = (
            (torch.arange(1, groups + 1, device=device) * shape[0] // groups - 37)
            .clamp(min=0)
            .to(torch.int32)
        )

        def make(shape=shape, ends=ends):
            x = torch.randn(shape, dtype=torch.bfloat16, device=device)
            return (x, *PAD_AND_QUANTIZE_MXFP8_2D.fake(x, ends, 32, "rceil"), ends)

        moved = _nbytes(make()[:3])
        cases.append(
            Case(
                f"{shape} padded G={groups}",
                ("quantize_1x32",),
                Quantize1x32Variant("bfloat16", "rceil", ScaleLayout.PADDED, 64),
                make,
                lambda _, k, x, q, s, ps, pe, e: k(x, q, s, e, ps, pe, 32),
                lambda _, a: a[1:5],
                lambda _, n=moved: n,
            )
        )
    return cases


def quantize_32x1(args: argparse.Namespace, device: torch.device) -> list[Case]:
    """bf16, blocked rceil scales; ``--groups G``: G row groups (K-groups scales)."""
    from cute_kernels.op_specs import scales_shape_32x1
    from cute_kernels.quantize_32x1 import Quantize32x1Variant, ScaleLayout

    layout = ScaleLayout.K_GROUPS if args.groups else ScaleLayout.BLOCKED
    variant = Quantize32x1Variant("bfloat16", "rceil", layout, rank=2)  # the 2-D op's entry
    shapes = ((32768, 2048), (32768, 7168), (131072, 2048), (131072, 5120), (131072, 7168))
    cases = []
    for rows, cols in shapes[:2] if args.quick else shapes:
        ends = block_group_ends(rows, args.groups, device) if args.groups else None
        shape = scales_shape_32x1(rows, cols, args.groups or None, True)

        def make(rows=rows, cols=cols, shape=shape, ends=ends):
            x = torch.randn(rows, cols, device=device, dtype=torch.bfloat16)
            q = torch.empty_strided((rows, cols), (1, rows), device=device, dtype=torch.float8_e4m3fn)
            return x, q, torch.empty(shape, device=device, dtype=torch.float8_e8m0fnu), ends

        moved = rows * cols * 3 + shape[0] * shape[1]
        cases.append(
            Case(
                f"{rows}x{cols}",
                ("quantize_32x1",),
                variant,
                make,
                lambda _, k, *a: k(*a),
                lambda _, a: a[1:3],
                lambda _, n=moved: n,
            )
        )
    return cases


def quantize_dual(args: argparse.Namespace, device: torch.device) -> list[Case]:
    """``--dtype`` x, rceil, blocked (``--groups G``: the grouped layout); every output checked
    against the two single calls (``quantize_mxfp8_2d`` 1x32, then 32x1)."""
    import torch_bindings
    from cute_kernels.quantize_dual import DualVariant, ScaleLayout

    layout = ScaleLayout.GROUPS if args.groups else ScaleLayout.BLOCKED
    shapes = [(8192, 2048), (8192, 5120), (32768, 2048), (32768, 5120), (32768, 7168), (131072, 5120)]
    shapes.append((131072, 7168))

    def single_calls(x, ends):
        q_r, s_r = torch_bindings.quantize_mxfp8_2d(x, block="1x32", group_end_offsets=ends)
        q_c, s_c = torch_bindings.quantize_mxfp8_2d(x, block="32x1", group_end_offsets=ends)
        return q_r, s_r, q_c, s_c

    cases = []
    for rows, cols in shapes:
        if args.rows and rows not in args.rows:
            continue
        ends = block_group_ends(rows, args.groups, device) if args.groups else None

        def make(rows=rows, cols=cols, ends=ends):
            x = torch.randn(rows, cols, device=device, dtype=getattr(torch, args.dtype))
            return (x, *[torch.empty_like(t) for t in single_calls(x, ends)], ends)

        moved = _nbytes(make()[:5])
        cases.append(
            Case(
                f"{rows}x{cols}",
                ("quantize_dual",),
                DualVariant(args.dtype, "rceil", layout),
                make,
                lambda _, k, *a: k(*a),
                lambda _, a: a[1:5],
                lambda _, n=moved: n,
                expected=lambda _, a: [t.contiguous().view(torch.uint8) for t in single_calls(a[0], a[5])],
            )
        )
    return cases


def pad(args: argparse.Namespace, device: torch.device) -> list[Case]:
    """pad and unpad of bf16 rows (their 16-byte int16 carrier), A = 32, skewed unaligned groups on
    seed 000's shapes; checked against the reference."""
    from cute_kernels.op_specs import padded_rows
    from cute_kernels.pad import RowGatherVariant
    from torch_bindings import reference

    shapes = [(16384, 1536, 8), (16384, 7168, 8), (16384, 2048, 16), (131072, 7168, 8)]
    cases = []
    for op, (tokens, dim, groups) in itertools.product(
        ("pad", "unpad"), shapes[:2] if args.quick else shapes
    ):
        ends = torch.tensor(skewed_group_ends(tokens, groups), dtype=torch.int32, device=device)
        padded = (padded_rows(tokens, groups, 32), dim)
        sizes = torch.diff(ends, prepend=ends.new_zeros(1))
        padded_end = ((sizes + 31) // 32 * 32).cumsum(0).to(torch.int32)
        padded_start = (padded_end - (sizes + 31) // 32 * 32).to(torch.int32)
        x_bytes = tokens * dim * 2

        def make(op=op, ends=ends, padded=padded, padded_start=padded_start, tokens=tokens, dim=dim):
            if op == "pad":
                x = torch.randn(tokens, dim, dtype=torch.bfloat16, device=device).view(torch.int16)
                out = torch.empty(padded, dtype=torch.int16, device=device)
                return x, out, ends, torch.empty_like(ends), torch.empty_like(ends)
            src = torch.randn(padded, dtype=torch.bfloat16, device=device).view(torch.int16)
            return src, torch.empty(tokens, dim, dtype=torch.int16, device=device), ends, padded_start

        def expected(op, a):
            if op == "pad":
                return [reference.pad_token_groups(a[0], a[2], alignment=32)[0].view(torch.uint8)]
            return [
                reference.unpad_token_groups(a[0], a[2], a[3], num_tokens=a[1].shape[0]).view(torch.uint8)
            ]

        cases.append(
            Case(
                f"{op} {(tokens, dim)} G={groups}",
                (op,),
                RowGatherVariant("int16", 16),
                make,
                lambda op, k, *a: k(*a, 32) if op == "pad" else k(*a),
                lambda _, a: (a[1],),
                lambda op, n=x_bytes, p=padded[0] * dim * 2: n + p if op == "pad" else 2 * n,
                expected=expected,
            )
        )
    return cases


def quantize_tma(args: argparse.Namespace, device: torch.device) -> list[Case]:
    """bf16, blocked scales (``--mode``); every config's bytes checked against the cp.async 1x32
    kernel's (its arch config)."""
    from cute_kernels import registry
    from cute_kernels.experimental.quantize_tma import TmaVariant
    from cute_kernels.quantize import Quantize1x32Variant, ScaleLayout
    from torch_bindings.backend import kernel_arch

    arch, _ = kernel_arch(device)
    cp_async = registry.entry("quantize_1x32").compile(
        Quantize1x32Variant("bfloat16", args.mode, ScaleLayout.BLOCKED), arch
    )

    def expected(_, a):
        q, s = (
            torch.full_like(t.view(torch.uint8), 0xA5).view(t.dtype) for t in a[1:3]
        )  # as the sweep resets
        cp_async(a[0], q, s, None, None, None, 0)
        return [q.view(torch.uint8), s.view(torch.uint8)]

    shapes = list(itertools.product((8192, 32768, 131072), (2048, 7168)))
    cases = []
    for shape in [(8192, 7168), (32768, 2048), (131072, 7168)] if args.quick else shapes:
        make = _quantize_sets(shape, torch.bfloat16, 0, device)
        moved = _nbytes(make()[:3])
        cases.append(
            Case(
                f"{shape}",
                ("quantize_tma",),
                TmaVariant("bfloat16", args.mode, ScaleLayout.BLOCKED),
                make,
                lambda _, k, x, q, s, e: k(x, q, s),
                lambda _, a: a[1:3],
                lambda _, n=moved: n,
                expected=expected,
            )
        )
    return cases


def quantize_fp8_row(args: argparse.Namespace, device: torch.device) -> list[Case]:
    """bf16 x (16384, K), power-of-2 scales, for the K values of each K class (the next power of 2
    of K: the binding's compile key)."""
    from cute_kernels.quantize_fp8 import Fp8RowVariant

    rows, cases = 16384, []
    for k_class, cols_list in {1024: (1024,), 2048: (2048,), 4096: (4096,), 8192: (5120, 7168)}.items():
        for cols in cols_list:

            def make(cols=cols):
                x = torch.randn(rows, cols, device=device, dtype=torch.bfloat16)
                q = torch.empty(rows, cols, device=device, dtype=torch.float8_e4m3fn)
                return x, q, torch.empty(rows, device=device, dtype=torch.float32)

            cases.append(
                Case(
                    f"{rows}x{cols}",
                    ("quantize_fp8_row",),
                    Fp8RowVariant("bfloat16"),
                    make,
                    lambda _, k, *a: k(*a),
                    lambda _, a: a[1:],
                    lambda _, n=rows * cols * 3 + rows * 4: n,
                    shape_class=f"bfloat16/k{k_class}",
                )
            )
    return cases


def quantize_fp8_col(args: argparse.Namespace, device: torch.device) -> list[Case]:
    """Each shape class the bindings key (dtype, layout, K class, group bucket; ``--dual``: the
    dual classes), bf16, G skewed row groups; the amax pass (x read once), then the cast pass (x
    read, q written), which reads the amax words the amax sweep left (every config's: the same)."""
    from cute_kernels.quantize_fp8_col import Fp8ColVariant
    from cute_utils.constants import FP8_POW2_MASK
    from torch_bindings.quantize_fp8 import _col_outputs, col_shape_class

    chosen = [("plain", (65536, k), 1) for k in (2048, 7168)]
    chosen += [("groups", (65536, k), g) for g in (1, 8, 64) for k in (2048, 7168)]
    chosen += [("experts", (8, 4096, 7168), 8), ("experts", (16, 4096, 7168), 16)]
    chosen += [("experts", (8, 7168, 2048), 8)]
    if args.quick:
        chosen = [("groups", (16384, 7168), 8)]
    if args.layouts:
        chosen = [c for c in chosen if c[0] in args.layouts]
    dual = args.dual
    cases = []
    for layout, shape, groups in chosen:
        steps = groups.bit_length()

        def make(layout=layout, shape=shape, groups=groups):
            x = torch.randn(shape, device=device, dtype=torch.bfloat16)
            rows, cols = shape[-2:]
            offsets = None
            if layout == "groups":
                offsets = torch.tensor(skewed_group_ends(rows, groups), dtype=torch.int32, device=device)
            q, scales, _, _ = _col_outputs(x, offsets)
            amax = torch.zeros(
                groups * cols + (x.numel() // cols if dual else 0), device=device, dtype=torch.int32
            )
            q_rows = torch.empty(shape, device=device, dtype=torch.float8_e4m3fn) if dual else None
            row_scales = torch.empty(shape[:-1], device=device, dtype=torch.float32) if dual else None
            return x, offsets, q, scales, amax, q_rows, row_scales

        def run(name, kernel, x, offsets, q, scales, amax, q_rows, row_scales, steps=steps):
            if name.endswith("amax"):
                kernel(x, amax, offsets, steps)
            else:
                kernel(x, q, amax, scales, offsets, FP8_POW2_MASK, steps, q_rows, row_scales)

        def outputs(name, a):
            return (
                (a[4],)
                if name.endswith("amax")
                else tuple(t for t in (a[2], a[3], a[5], a[6]) if t is not None)
            )

        x_bytes = 2 * shape[-2] * shape[-1] * (shape[0] if len(shape) == 3 else 1)
        cast_bytes = x_bytes + x_bytes // 2 * (2 if dual else 1) + 4 * groups * shape[-1]
        cases.append(
            Case(
                f"{layout} {shape} G={groups}",
                ("quantize_fp8_col_amax", "quantize_fp8_col_cast"),
                Fp8ColVariant("bfloat16", layout, dual=dual),
                make,
                run,
                outputs,
                lambda name, a=x_bytes, c=cast_bytes: a if name.endswith("amax") else c,
                shape_class=col_shape_class("bfloat16", layout, shape[-1], groups, dual),
                fill=lambda name: 0 if name.endswith("amax") else 0xA5,
            )
        )
    return cases


def grouped_gemm(args: argparse.Namespace, device: torch.device) -> list[Case]:
    """The sm_90a FP8 grouped GEMM's three GEMMs of an expert layer at ``bench_grouped_gemm``'s
    shapes (skewed groups; ``--quick``: the first shape): forward and dgrad (2d3d), wgrad (2d2d),
    operands from the reference quantizers. The ratio column is to a copy of the operands' and
    output's bytes: only its order means something for a GEMM (bench_grouped_gemm gives TFLOP/s)."""
    from bench.bench_grouped_gemm import SHAPES
    from cute_kernels.grouped_gemm_sm90 import GroupedGemmVariant
    from torch_bindings import reference as ref
    from torch_bindings.backend import num_sms

    if torch.cuda.get_device_capability(device)[0] != 9:
        raise SystemExit("error: bench.tune grouped_gemm needs an sm_90 GPU (the kernel is sm_90a only)")
    sms, cases = num_sms(device.index), []
    for s in SHAPES[:1] if args.quick else SHAPES:
        ends = torch.tensor(skewed_group_ends(s.tokens, s.experts, seed=1), dtype=torch.int32, device=device)
        for gemm, form, (m, n, k) in (
            ("forward", "2d3d", (s.tokens, s.hidden, s.dim)),
            ("dgrad", "2d3d", (s.tokens, s.dim, s.hidden)),
            ("wgrad", "2d2d", (s.tokens, s.hidden, s.dim)),
        ):

            def make(form=form, m=m, n=n, k=k, e=s.experts, ends=ends):
                if form == "2d3d":
                    a, sa = ref.quantize_fp8_2d(
                        torch.randn(m, k, device=device, dtype=torch.bfloat16), axis="row"
                    )
                    w = (torch.randn(e, n, k, device=device) * 0.02).to(torch.bfloat16)
                    b, sb = ref.quantize_fp8_3d(w, axis="K")
                    out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
                else:  # a (N, M), b (K, M): the column operands of grad_y and x, transposed
                    gy, x = (torch.randn(m, c, device=device, dtype=torch.bfloat16) for c in (n, k))
                    qa, sa = ref.quantize_fp8_2d(gy, axis="col", group_end_offsets=ends)
                    qb, sb = ref.quantize_fp8_2d(x, axis="col", group_end_offsets=ends)
                    a, b, out = qa.t(), qb.t(), torch.empty(e, n, k, device=device, dtype=torch.bfloat16)
                return a, b, sa, sb, ends, out

            if form == "2d3d":  # a, every expert's b, y
                moved = m * k + s.experts * n * k + 2 * m * n
            else:  # both column operands, every group's (N, K) output
                moved = n * m + k * m + 2 * s.experts * n * k
            cases.append(
                Case(
                    f"{s.name} {gemm}",
                    ("grouped_gemm_sm90",),
                    GroupedGemmVariant(form),
                    make,
                    lambda _, kernel, *a: kernel(*a, sms),
                    lambda _, a: a[5:],
                    lambda _, n=moved: n,
                    shape_class=f"{form}/{gemm}",
                )
            )
    return cases


def swiglu(args: argparse.Namespace, device: torch.device) -> list[Case]:
    """SwiGLU + FP8 rowwise, forward and backward, M = 16384 rows of each H class the expert blocks
    meet (H = 2048: class 2048; 4096; 7168 and 8192: class 8192), power-of-2 scales, checked
    against the reference's bytes; ``--quick``: H = 2048 and 8192."""
    from cute_kernels.swiglu import SwigluVariant
    from torch_bindings import reference as ref
    from torch_bindings.swiglu import silu_table, swiglu_shape_class

    rows, cases = 16384, []
    table, num_sms = silu_table(device), torch.cuda.get_device_properties(device).multi_processor_count
    hidden = (2048, 8192) if args.quick else (2048, 4096, 7168, 8192)
    for direction, half in itertools.product(("fwd", "bwd"), hidden):
        out_cols = 2 * half if direction == "bwd" else half

        def make(direction=direction, half=half, out_cols=out_cols):
            h13 = torch.randn(rows, 2 * half, device=device, dtype=torch.bfloat16)
            grad = (
                torch.randn(rows, half, device=device, dtype=torch.bfloat16) if direction == "bwd" else None
            )
            out = torch.empty(rows, out_cols, device=device, dtype=torch.bfloat16)
            q = torch.empty(rows, out_cols, device=device, dtype=torch.float8_e4m3fn)
            return h13, out, q, torch.empty(rows, device=device, dtype=torch.float32), grad, table, num_sms

        def expected(_, a, direction=direction):
            h13, grad = a[0], a[4]
            if direction == "fwd":
                want = ref.swiglu_quantize_fp8(h13, round_scales_to_power_of_2=True)
            else:
                want = ref.swiglu_backward_quantize_fp8(grad, h13, round_scales_to_power_of_2=True)
            return [t.view(torch.uint8) for t in want]  # the sweep compares bytes

        inputs = (3 if direction == "bwd" else 2) * half * 2
        moved = rows * (inputs + out_cols * 3 + 4)  # read; bf16 out, q written; scales
        cases.append(
            Case(
                f"{direction} {rows}x{half}",
                ("swiglu_fp8",),
                SwigluVariant(direction),
                make,
                lambda _, kernel, *a: kernel(*a),
                lambda _, a: a[1:4],
                lambda _, n=moved: n,
                shape_class=swiglu_shape_class(direction, half),
                expected=expected,
            )
        )
    return cases
