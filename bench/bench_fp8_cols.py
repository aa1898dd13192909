"""Benchmark the FP8 column-scale kernels (SPEC section 7): ``quantize_fp8_2d(axis="col")`` with G
row groups (G = 1: no offsets, one scale per column) and ``quantize_fp8_3d(axis="N")``.

2-D: bf16 x (M, K), M in (16384, 65536, 131072), K in (2048, 5120, 7168), G in (1, 8, 64) (skewed
group sizes, ``bench.common.groups``); 3-D: w (E, N, K) in (8, 2048, 5120 | 7168) and
(16, 8192, 5120 | 7168) (``--quick`` keeps them all); power-of-2 scales. Two passes over x (amax,
cast): bytes moved = 2 reads of x + q written + scales written (the amax words, G K int32, are not
counted). Ratio to copy = copy us / our
us for the same bytes, copy timed in the same run. Anchor, same run, same output:
``triton_fp8_per_group_colwise_scales`` (2-D; G = 1 with offsets [M]) and
``triton_fp8_rowwise_3d_transpose_rhs`` (3-D; it reads w^T (E, K, N)), their q bytes and scales
(``1 / theirs``) checked against ours. Goal (issue 20): >= 0.80 of copy counting both passes, >= 3x
torchao.

The dual (``quantize_fp8_2d_dual``, same 2-D shapes): bytes moved = 2 reads of x + both q + both
scales; beside it ``unfused_us`` (our row op then our column op: x read three times) and torchao's
``triton_fp8_rowwise_2d_scale_and_cast`` + ``triton_fp8_per_group_colwise_scales``.

The 3-D dual (``quantize_fp8_3d_dual``, part ``3d_dual``, the 3-D shapes): bytes moved = 2 reads of
w + q_k + q_n + s_k + s_n; ``copy_us`` the copy of those bytes (the floor), ``ratio`` = copy_us /
us; beside it ``singles_us``: ``quantize_fp8_3d(axis="K")`` then ``(axis="N")`` (w read three
times), ``speedup`` = singles_us / us, and ``same_bytes``: the dual's four outputs against the two
single calls'. Its shapes add the expert block's two weights at ``bench_moe``'s module shapes.

The padded column operand (``pad_and_quantize_fp8_2d_cols``, part ``padded``, the 2-D shapes at
G in (8, 64), alignments 16 and 128): bytes moved = 2 reads of x + q (its padded rows) + scales;
beside it ``unpadded_us``, the same groups' ``quantize_fp8_2d(axis="col")`` (q of M rows), and
``slowdown`` = us / unpadded_us.

The padded dual (``pad_and_quantize_fp8_2d_dual``, part ``padded_dual``, the 2-D shapes at (G, A) in
(8, 16), (8, 128), (64, 128)): bytes moved = 2 reads of x + q_row + q_col (its padded rows) + both
scales; beside it ``singles_us``, the bounded row op then ``pad_and_quantize_fp8_2d_cols`` (x read
three times), ``speedup`` = singles_us / us, and ``same_bytes``: every output against theirs (the row
outputs below the last group end).

Run (GPU machine, project root on PYTHONPATH; exits 2 without a GPU)::

    python -m bench.bench_fp8_cols [--quick] [--rows M ...] [--out DIR]
        [--parts cols,3d,dual,3d_dual,padded,padded_dual]
    python -m bench.bench_fp8_cols --once   # the 3-D dual and its N single call, untimed (ncu)
"""

from __future__ import annotations

import torch

import torch_bindings
from bench.common.baselines import copy_baseline_best
from bench.common.cli import add_parts_arg, make_parser, output_paths, progress
from bench.common.device import cuda_or_none
from bench.common.groups import skewed_group_ends
from bench.common.report import report
from bench.common.rows import gbps
from bench.common.timing import make_rotating_inputs, time_cuda

ROWS, COLS, GROUPS = (16384, 65536, 131072), (2048, 5120, 7168), (1, 8, 64)
EXPERTS = [(8, 2048, 5120), (8, 2048, 7168), (16, 8192, 5120), (16, 8192, 7168)]
#: The 3-D dual's shapes: EXPERTS, then the expert block's weights at bench_moe's module shapes
#: (w13 (E, 2H, D) and w2 (E, D, H)).
EXPERTS_DUAL = EXPERTS + [(8, 4096, 7168), (8, 7168, 2048), (16, 16384, 5120), (16, 5120, 8192)]


def _torchao():
    """torchao's Triton kernels ``(per-group colwise, 3d transpose rhs, 2d rowwise)``, or Nones."""
    try:
        from torchao.prototype.moe_training.kernels.float8_rowwise import (
            triton_fp8_rowwise_2d_scale_and_cast,
            triton_fp8_rowwise_3d_transpose_rhs,
        )
        from torchao.prototype.moe_training.kernels.jagged_float8_scales import (
            triton_fp8_per_group_colwise_scales,
        )
    except Exception:  # noqa: BLE001 - no torchao: no anchor column
        return None, None, None
    return (
        triton_fp8_per_group_colwise_scales,
        triton_fp8_rowwise_3d_transpose_rhs,
        triton_fp8_rowwise_2d_scale_and_cast,
    )


def _same(ours: tuple, theirs: tuple) -> str:
    q, s = ours
    ao_q, ao_scale = theirs
    same = ao_q.stride() == q.stride() and torch.equal(ao_q.view(torch.uint8), q.view(torch.uint8))
    same = same and torch.equal(
        (1.0 / ao_scale.reshape(-1)).view(torch.int32), s.reshape(-1).view(torch.int32)
    )
    return "yes" if same else "NO"


def _inputs_2d(rows: int, cols: int, groups: int, bytes_per_set: int) -> tuple:
    """``(device, ends, offsets, sets)``: skewed group ends (int32 (G,)), the offsets the op takes
    (None for G = 1) and rotating bf16 x (rows, cols) input sets."""
    device = torch.device("cuda")
    ends = torch.tensor(skewed_group_ends(rows, groups), dtype=torch.int32, device=device)
    sets = make_rotating_inputs(
        lambda: (torch.randn(rows, cols, device=device, dtype=torch.bfloat16),), bytes_per_set=bytes_per_set
    )
    return device, ends, None if groups == 1 else ends, sets


def bench_2d(rows: int, cols: int, groups: int, torchao_fn) -> dict:
    device, ends, offsets, sets = _inputs_2d(rows, cols, groups, 3 * rows * cols)

    def run(x):
        return torch_bindings.quantize_fp8_2d(x, axis="col", group_end_offsets=offsets)

    x0 = sets[0][0]
    q, s = run(x0)
    moved = 2 * x0.numel() * x0.element_size() + q.numel() + s.numel() * 4
    us = time_cuda(run, sets)
    copy_us = copy_baseline_best(moved, device)[0].us
    row = {"shape": f"{rows}x{cols}", "G": groups, "us": us, "GB/s": gbps(moved, us), "ratio": copy_us / us}
    if torchao_fn is not None:
        ao = torchao_fn(x0, ends, round_scales_to_power_of_2=True)
        ao_us = time_cuda(lambda x: torchao_fn(x, ends, round_scales_to_power_of_2=True), sets)
        row.update({"torchao_us": ao_us, "speedup": ao_us / us, "same_bytes": _same((q, s), ao)})
    return row


def bench_padded(rows: int, cols: int, groups: int, alignment: int) -> dict:
    """``pad_and_quantize_fp8_2d_cols`` beside the unpadded column op on the same groups."""
    device, ends, _, sets = _inputs_2d(rows, cols, groups, 3 * rows * cols)

    def run(x):
        return torch_bindings.pad_and_quantize_fp8_2d_cols(x, ends, alignment=alignment)

    x0 = sets[0][0]
    q, s, _, _ = run(x0)
    moved = 2 * x0.numel() * x0.element_size() + q.numel() + s.numel() * 4
    us = time_cuda(run, sets)
    copy_us = copy_baseline_best(moved, device)[0].us
    unpadded_us = time_cuda(
        lambda x: torch_bindings.quantize_fp8_2d(x, axis="col", group_end_offsets=ends), sets
    )
    return {"shape": f"{rows}x{cols}", "G": groups, "A": alignment, "us": us, "GB/s": gbps(moved, us),
            "ratio": copy_us / us, "unpadded_us": unpadded_us, "slowdown": us / unpadded_us}  # fmt: skip


def bench_padded_dual(rows: int, cols: int, groups: int, alignment: int) -> dict:
    """``pad_and_quantize_fp8_2d_dual`` (two reads of x) beside the two ops it replaces: the bounded
    row op then ``pad_and_quantize_fp8_2d_cols`` (three reads), with their bytes compared (the rows
    below the last group end)."""
    device, ends, _, sets = _inputs_2d(rows, cols, groups, 4 * rows * cols)

    def run(x):
        return torch_bindings.pad_and_quantize_fp8_2d_dual(x, ends, alignment=alignment)

    def singles(x):
        rows_out = torch_bindings.quantize_fp8_2d(x, axis="row", group_end_offsets=ends)
        return (*rows_out, *torch_bindings.pad_and_quantize_fp8_2d_cols(x, ends, alignment=alignment))

    x0 = sets[0][0]
    got, want = run(x0), singles(x0)
    q_row, s_row, q_col, s_col = got[:4]
    moved = 2 * x0.numel() * x0.element_size() + q_row.numel() + q_col.numel()
    moved += (s_row.numel() + s_col.numel()) * 4
    us = time_cuda(run, sets)
    copy_us = copy_baseline_best(moved, device)[0].us
    singles_us = time_cuda(singles, sets)
    bound = int(ends[-1])  # test data: the one sync, outside the timed calls
    same = all(
        torch.equal(a[:bound].view(torch.uint8), b[:bound].view(torch.uint8)) if i < 2 else torch.equal(a, b)
        for i, (a, b) in enumerate(zip(got, want, strict=True))
    )
    return {"shape": f"{rows}x{cols}", "G": groups, "A": alignment, "us": us, "GB/s": gbps(moved, us),
            "ratio": copy_us / us, "singles_us": singles_us, "speedup": singles_us / us,
            "same_bytes": "yes" if same else "NO"}  # fmt: skip


def bench_dual(rows: int, cols: int, groups: int, anchors: tuple) -> dict:
    """``quantize_fp8_2d_dual`` (two reads of x) beside our row and column ops called one after
    the other (three reads) and torchao's two kernels for the same outputs."""
    device, ends, offsets, sets = _inputs_2d(rows, cols, groups, 4 * rows * cols)

    def run(x):
        return torch_bindings.quantize_fp8_2d_dual(x, group_end_offsets=offsets)

    def unfused(x):
        torch_bindings.quantize_fp8_2d(x, axis="row")
        return torch_bindings.quantize_fp8_2d(x, axis="col", group_end_offsets=offsets)

    x0 = sets[0][0]
    q_row, s_row, q_col, s_col = run(x0)
    moved = 2 * x0.numel() * x0.element_size() + 2 * q_row.numel() + (s_row.numel() + s_col.numel()) * 4
    us = time_cuda(run, sets)
    copy_us = copy_baseline_best(moved, device)[0].us
    row = {"shape": f"{rows}x{cols}", "G": groups, "us": us, "GB/s": gbps(moved, us), "ratio": copy_us / us}
    row["unfused_us"] = time_cuda(unfused, sets)
    rowwise, colwise = anchors
    if rowwise is not None and colwise is not None:

        def theirs(x):
            rowwise(x, round_scales_to_power_of_2=True)
            return colwise(x, ends, round_scales_to_power_of_2=True)

        ao_us = time_cuda(theirs, sets)
        row.update(
            {"torchao_us": ao_us, "speedup": ao_us / us, "same_bytes": _same((q_col, s_col), theirs(x0))}
        )
    return row


def bench_3d(shape: tuple[int, int, int], torchao_fn) -> dict:
    device = torch.device("cuda")
    experts, n, k = shape
    sets = make_rotating_inputs(
        lambda: (torch.randn(experts, k, n, device=device, dtype=torch.bfloat16),),
        bytes_per_set=6 * experts * n * k,
    )
    sets = [(wt, wt.transpose(1, 2).contiguous()) for (wt,) in sets]  # torchao reads (E, K, N)

    def run(wt, w):
        return torch_bindings.quantize_fp8_3d(w, axis="N")

    q, s = run(*sets[0])
    moved = 2 * q.numel() * 2 + q.numel() + s.numel() * 4
    us = time_cuda(run, sets)
    copy_us = copy_baseline_best(moved, device)[0].us
    row = {
        "shape": "x".join(map(str, shape)),
        "G": experts,
        "us": us,
        "GB/s": gbps(moved, us),
        "ratio": copy_us / us,
    }
    if torchao_fn is not None:
        ao = torchao_fn(sets[0][0], round_scales_to_power_of_2=True)
        ao_us = time_cuda(lambda wt, w: torchao_fn(wt, round_scales_to_power_of_2=True), sets)
        row.update({"torchao_us": ao_us, "speedup": ao_us / us, "same_bytes": _same((q, s), ao)})
    return row


def bench_3d_dual(shape: tuple[int, int, int]) -> dict:
    """``quantize_fp8_3d_dual`` (two reads of w) beside ``quantize_fp8_3d`` with ``axis="K"`` then
    ``axis="N"`` (three reads), on bf16 w (E, N, K) rotated past L2."""
    device = torch.device("cuda")
    experts, n, k = shape
    sets = make_rotating_inputs(
        lambda: (torch.randn(experts, n, k, device=device, dtype=torch.bfloat16),),
        bytes_per_set=4 * experts * n * k,  # w and both q
    )

    def run(w):
        return torch_bindings.quantize_fp8_3d_dual(w)

    def singles(w):
        return (*torch_bindings.quantize_fp8_3d(w, axis="K"), *torch_bindings.quantize_fp8_3d(w, axis="N"))

    w0 = sets[0][0]
    got, want = run(w0), singles(w0)
    same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, want, strict=True))
    q_k, s_k, _, s_n = got
    moved = 2 * w0.numel() * w0.element_size() + 2 * q_k.numel() + 4 * (s_k.numel() + s_n.numel())
    us = time_cuda(run, sets)
    copy_us = copy_baseline_best(moved, device)[0].us
    singles_us = time_cuda(singles, sets)
    return {
        "shape": "x".join(map(str, shape)),
        "MB": moved / 1e6,
        "copy_us": copy_us,
        "us": us,
        "GB/s": gbps(moved, us),
        "ratio": copy_us / us,
        "singles_us": singles_us,
        "speedup": singles_us / us,
        "same_bytes": "yes" if same else "NO",
    }


def run_once(shape: tuple[int, int, int]) -> None:
    """``quantize_fp8_3d_dual`` then ``quantize_fp8_3d(axis="N")`` on bf16 w ``shape``, once each,
    untimed: the launches a profiler filters (``ncu -k regex:Fp8ColAmax -c 2``: the dual's amax
    pass, then the experts layout's single amax pass)."""
    w = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    torch_bindings.quantize_fp8_3d_dual(w)
    torch_bindings.quantize_fp8_3d(w, axis="N")
    torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: 0, or 2 without a GPU."""
    parser = make_parser(__doc__.splitlines()[0])  # --quick: K = 7168, M = 16384, 131072
    parser.add_argument("--rows", type=int, nargs="+", help="these M only (default: all, or --quick's)")
    add_parts_arg(parser, ("cols", "3d", "dual", "3d_dual", "padded", "padded_dual"))
    parser.add_argument("--once", action="store_true", help="the 3-D dual at 16 x 8192 x 5120, untimed (ncu)")
    args = parser.parse_args(argv)
    if cuda_or_none("bench_fp8_cols") is None:
        return 2
    if args.once:
        run_once(EXPERTS[2])
        return 0
    parts = args.parts
    colwise, transpose_rhs, rowwise = _torchao()
    rows_list = args.rows or ((16384, 131072) if args.quick else ROWS)
    cols_list = (7168,) if args.quick else COLS
    results = []
    for rows in rows_list if "cols" in parts else ():
        for cols in cols_list:
            for groups in GROUPS:
                progress(f"2d {rows}x{cols} G={groups}")
                results.append(bench_2d(rows, cols, groups, colwise))
                torch.cuda.empty_cache()
    for shape in EXPERTS if "3d" in parts else ():
        progress(f"3d {shape}")
        results.append(bench_3d(shape, transpose_rhs))
        torch.cuda.empty_cache()
    duals = []
    for rows in rows_list if "dual" in parts else ():
        for cols in cols_list:
            for groups in GROUPS:
                progress(f"dual {rows}x{cols} G={groups}")
                duals.append(bench_dual(rows, cols, groups, (rowwise, colwise)))
                torch.cuda.empty_cache()
    duals_3d = []
    for shape in EXPERTS_DUAL if "3d_dual" in parts else ():
        progress(f"3d dual {shape}")
        duals_3d.append(bench_3d_dual(shape))
        torch.cuda.empty_cache()
    padded = []
    for rows in rows_list if "padded" in parts else ():
        for cols in cols_list:
            for groups, alignment in ((8, 16), (8, 128), (64, 16), (64, 128)):
                progress(f"padded {rows}x{cols} G={groups} A={alignment}")
                padded.append(bench_padded(rows, cols, groups, alignment))
                torch.cuda.empty_cache()
    padded_duals = []
    for rows in rows_list if "padded_dual" in parts else ():
        for cols in cols_list:
            for groups, alignment in ((8, 16), (8, 128), (64, 128)):
                progress(f"padded dual {rows}x{cols} G={groups} A={alignment}")
                padded_duals.append(bench_padded_dual(rows, cols, groups, alignment))
                torch.cuda.empty_cache()
    print(f"device: {torch.cuda.get_device_name()}")
    for title, stem, rows_ in (
        ("FP8 column scales, two passes (bf16, power-of-2 scales)", "fp8_cols", results),
        ("FP8 dual (row and column scales), two passes (bf16, power-of-2 scales)", "fp8_dual", duals),
        ("FP8 3-D dual (K and N scales of w), two passes (bf16, power-of-2 scales)", "fp8_dual_3d", duals_3d),
        ("FP8 column scales into padded groups (bf16, power-of-2 scales)", "fp8_cols_padded", padded),
        ("FP8 dual into padded groups (bf16, power-of-2 scales)", "fp8_dual_padded", padded_duals),
    ):
        if not rows_:
            continue
        keys = list(dict.fromkeys(k for r in rows_ for k in r))
        report(rows_, keys, title, json_path=output_paths(args.out, stem)[0], panel_key=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
