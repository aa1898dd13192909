"""scaled_grouped_mm and GroupedExperts (SPEC section 8): forward and both gradients against fp32
math (SQNR), empty and tiny groups, the GEMM path choice, input errors. CPU tests run the reference
quantizers and the emulated GEMMs; GPU tests (marked) the kernels, torch._scaled_grouped_mm,
no-sync, torch.compile and CUDA graphs."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import torch_bindings as tb
from tests.conftest import no_sync, random_group_ends
from tests.support.grouped_mm_cases import (
    LAYOUTS,
    count_fp8_column_operands,
    fp32_grouped_mm,
    fp32_swiglu_experts,
    layout_ends,
    sqnr_db,
)
from torch_bindings.moe import grouped_mm
from torch_bindings.warn import forget

# SQNR floors (dB): the 25 for one FP8/MXFP8 GEMM; bf16 operands only round the output.
OP_FLOOR = {"fp8_rowwise": 25.0, "mxfp8": 25.0, "bf16": 40.0}
# Three chained low-precision GEMMs and a SwiGLU lose a little more (measured ~26-27 dB).
MODULE_FLOOR = {"fp8_rowwise": 22.0, "mxfp8": 22.0, "bf16": 35.0}


def _inputs(rows: int, groups: int, k: int, n: int, device: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    w = (torch.randn(groups, n, k, generator=gen) / k**0.5).to(torch.bfloat16)
    grad_y = torch.randn(rows, n, generator=gen).to(torch.bfloat16)
    return x.to(device), w.to(device), grad_y.to(device)


def _run_op(x, w, ends_t, grad_y, recipe: str, gemm: str):
    x = x.clone().requires_grad_()
    w = w.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = tb.scaled_grouped_mm(x, w, ends_t, recipe=recipe, gemm=gemm)
    y.backward(grad_y)
    return y, x.grad, w.grad


def _check_against_fp32(recipe, gemm, rows, ends: list[int], k, n, device):
    groups = len(ends)
    x, w, grad_y = _inputs(rows, groups, k, n, device)
    ends_t = torch.tensor(ends, dtype=torch.int32, device=device)
    y, grad_x, grad_w = _run_op(x, w, ends_t, grad_y, recipe, gemm)
    y_ref, gx_ref, gw_ref = fp32_grouped_mm(x, w, ends, grad_y)
    owned = ends[-1]  # rows past the last end are unspecified
    floor = OP_FLOOR[recipe]
    assert y.shape == (rows, n) and y.dtype == torch.bfloat16
    assert sqnr_db(y[:owned], y_ref[:owned]) >= floor
    assert sqnr_db(grad_x[:owned], gx_ref[:owned]) >= floor
    sizes_now = [e - s for s, e in zip([0, *ends[:-1]], ends, strict=True)]
    for g, size in enumerate(sizes_now):
        if size == 0:
            assert torch.count_nonzero(grad_w[g]) == 0, f"empty group {g}: grad_w must be 0"
    assert sqnr_db(grad_w, gw_ref) >= floor


@pytest.mark.parametrize("layout", LAYOUTS, ids=[case[0] for case in LAYOUTS])
@pytest.mark.parametrize("recipe", ["fp8_rowwise", "mxfp8", "bf16"])
def test_cpu_recipes_match_fp32_math(recipe, layout):
    _, rows, groups, sizes = layout
    _check_against_fp32(recipe, "auto", rows, layout_ends(rows, groups, sizes), 64, 96, "cpu")


@pytest.mark.parametrize("recipe", ["fp8_rowwise", "mxfp8", "bf16"])
def test_cpu_module_matches_fp32_math(recipe):
    rows, groups, dim, hidden = 300, 6, 64, 96
    ends = layout_ends(rows, groups, [0, 1, 0, 44, 17, 200])
    _check_module(recipe, "auto", rows, groups, dim, hidden, ends, "cpu")


def _check_module(recipe, gemm, rows, groups, dim, hidden, ends, device):
    torch.manual_seed(0)
    module = tb.GroupedExperts(groups, dim, hidden, recipe=recipe, gemm=gemm, device=device)
    x, _, grad_out = _inputs(rows, groups, dim, dim, device, seed=1)
    x.requires_grad_()
    ends_t = torch.tensor(ends, dtype=torch.int32, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = module(x, ends_t)
    out.backward(grad_out)
    expected = fp32_swiglu_experts(x, module.w13, module.w2, ends, grad_out)
    owned, floor = ends[-1], MODULE_FLOOR[recipe]
    assert sqnr_db(out[:owned], expected[0][:owned]) >= floor
    assert sqnr_db(x.grad[:owned], expected[1][:owned]) >= floor
    for got, want in zip((module.w13.grad, module.w2.grad), expected[2:], strict=True):
        assert sqnr_db(got, want) >= floor


def test_cpu_gemm_choice_is_explicit():
    x, w, _ = _inputs(32, 2, 32, 32, "cpu")
    ends = torch.tensor([16, 32], dtype=torch.int32)
    for recipe in ("fp8_rowwise", "mxfp8"):
        with pytest.raises(RuntimeError, match="gemm='native' cannot run here"):
            tb.scaled_grouped_mm(x, w, ends, recipe=recipe, gemm="native")
        forget(grouped_mm.emulation_warning(recipe, "cpu"))
        with pytest.warns(UserWarning, match="EMULATION") as record:
            line = inspect.currentframe().f_lineno + 1
            tb.scaled_grouped_mm(x, w, ends, recipe=recipe)
        (warned,) = [r for r in record if "EMULATION" in str(r.message)]
        assert (warned.filename, warned.lineno) == (__file__, line)  # this line, not the library's
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            tb.scaled_grouped_mm(x, w, ends, recipe=recipe)  # warned once already
            tb.scaled_grouped_mm(x, w, ends, recipe=recipe, gemm="emulated")
    assert grouped_mm.gemm_path("bf16", torch.device("cpu"), "native") == "native"


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(x=torch.zeros(32, 32, dtype=torch.float16)), TypeError, "x must be"),
        (dict(w=torch.zeros(2, 32, 48, dtype=torch.bfloat16)), ValueError, r"w must have shape \(2, 32, 32"),
        (dict(ends=torch.tensor([32], dtype=torch.int32)), ValueError, "one entry per expert"),
        (dict(ends=torch.tensor([16, 32])), TypeError, "group_end_offsets"),
        (dict(recipe="fp4"), ValueError, "recipe must be one of"),
        (dict(gemm="fast"), ValueError, "gemm must be one of"),
        (dict(out_dtype=torch.float32), ValueError, "out_dtype"),
        (
            dict(w=torch.zeros(2, 40, 32, dtype=torch.bfloat16)),
            ValueError,
            r"N \(w.shape\[1\]\) \(40\) must be a multiple of 16",
        ),
    ],
)
def test_cpu_input_errors(change, error, match):
    args = dict(
        x=torch.zeros(32, 32, dtype=torch.bfloat16),
        w=torch.zeros(2, 32, 32, dtype=torch.bfloat16),
        ends=torch.tensor([16, 32], dtype=torch.int32),
        recipe="fp8_rowwise",
        gemm="auto",
        out_dtype=torch.bfloat16,
    )
    args.update(change)
    with pytest.raises(error, match=match):
        tb.scaled_grouped_mm(
            args["x"],
            args["w"],
            args["ends"],
            recipe=args["recipe"],
            out_dtype=args["out_dtype"],
            gemm=args["gemm"],
        )


# ----------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------

# (K, N): K > N, K < N and K = N (row tiles, column tiles and the K classes of the kernels differ).
GPU_DIMS = [(256, 64), (64, 256), (128, 128)]
# The GPU paths of each recipe (fp8_rowwise on torch's GEMM); the no-sync, graph and compile tests
# also run fp8_rowwise with gemm="auto", the project's GEMM where auto picks it.
GPU_PATHS = [("fp8_rowwise", "native"), ("mxfp8", "emulated"), ("bf16", "auto")]


@pytest.mark.gpu
@pytest.mark.parametrize("dims", GPU_DIMS, ids=[f"k{k}n{n}" for k, n in GPU_DIMS])
@pytest.mark.parametrize("layout", LAYOUTS, ids=[case[0] for case in LAYOUTS])
@pytest.mark.parametrize("recipe, gemm", GPU_PATHS)
def test_gpu_recipes_match_fp32_math(recipe, gemm, layout, dims):
    _, rows, groups, sizes = layout
    _check_against_fp32(recipe, gemm, rows, layout_ends(rows, groups, sizes), *dims, "cuda")


def fuzz_case(seed: int) -> tuple[int, list[int], int, int]:
    """Seeded (rows, ends, K, N): G in 1, 2, 8, 64 (the edge sizes 0, 1, 44, 127, 129 mixed in when
    G > 5, other groups often empty), M from 1 to 1500 (last end often below M), K and N from
    multiples of 32 around the kernels' tiles."""
    gen = torch.Generator().manual_seed(seed)
    groups = (1, 2, 8, 64)[seed % 4]
    rows = int(torch.randint(1, 1500, (1,), generator=gen))
    dims = (32, 64, 96, 160, 256)
    k, n = (dims[int(i)] for i in torch.randint(0, len(dims), (2,), generator=gen))
    return rows, random_group_ends(rows, groups, gen), k, n


@pytest.mark.parametrize("seed", range(4))
def test_cpu_fuzzed_layouts(seed):
    rows, ends, k, n = fuzz_case(seed)
    for recipe in ("fp8_rowwise", "mxfp8"):
        _check_against_fp32(recipe, "auto", rows, ends, k, n, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(16))
def test_gpu_fuzzed_layouts(seed, poison_cuda_allocator):
    """Seeded layouts on dirty memory (the allocator's free blocks poisoned first)."""
    rows, ends, k, n = fuzz_case(seed)
    for recipe, gemm in GPU_PATHS:
        poison_cuda_allocator(1 << 26)
        _check_against_fp32(recipe, gemm, rows, ends, k, n, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("recipe, gemm", GPU_PATHS)
def test_gpu_module_matches_fp32_math(recipe, gemm):
    ends = layout_ends(3000, 8, None, seed=3)
    _check_module(recipe, gemm, 3000, 8, 256, 128, ends, "cuda")


def _op_step(x, w, ends, grad_y, recipe, gemm):
    x.grad = w.grad = None
    y = tb.scaled_grouped_mm(x, w, ends, recipe=recipe, gemm=gemm)
    y.backward(grad_y)
    return y, x.grad, w.grad


@pytest.mark.gpu
@pytest.mark.parametrize("recipe, gemm", [*GPU_PATHS, ("fp8_rowwise", "auto")])
def test_gpu_no_sync_and_cuda_graph(recipe, gemm):
    """Forward + backward never sync, and a CUDA graph of them replays the eager bits."""
    x, w, grad_y = _inputs(1000, 8, 256, 128, "cuda")
    ends = torch.tensor(layout_ends(1000, 8, None, seed=5), dtype=torch.int32, device="cuda")
    x.requires_grad_()
    w.requires_grad_()
    _op_step(x, w, ends, grad_y, recipe, gemm)  # compile / load the kernels
    with no_sync():
        eager = [t.detach().clone() for t in _op_step(x, w, ends, grad_y, recipe, gemm)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _op_step(x, w, ends, grad_y, recipe, gemm)  # warm up on a side stream, results dropped
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    x.grad = w.grad = None
    with torch.cuda.graph(graph):
        captured = _op_step(x, w, ends, grad_y, recipe, gemm)
    graph.replay()
    owned = int(ends[-1])  # rows past the last end are unspecified
    for got, want in zip(
        (captured[0][:owned], captured[1][:owned], captured[2]),
        (eager[0][:owned], eager[1][:owned], eager[2]),
        strict=True,
    ):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.gpu
def test_gpu_mxfp8_native_calls_shape_check():
    """The sm_100-only MXFP8 GEMM calls, shape-checked by torch's meta functions under
    FakeTensorMode (no Blackwell here to run them) on operands shaped as the quantizers return
    them (SPEC sections 3 and 5): q (Mp, C) row-major or (Mp, C) column-major, M-groups, K-groups
    and per-expert blocked scales."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torch_bindings.reference import blocked_shape

    experts, rows, k, n = 4, 320, 128, 96
    step = grouped_mm._Step("mxfp8", emulated=False, aligned=True)
    e4m3, e8m0 = torch.float8_e4m3fn, torch.float8_e8m0fnu

    def m_groups(cols):  # M-groups scales of (rows, cols): (rows + 128 G, Cp)
        return torch.empty(
            rows + 128 * experts, blocked_shape(rows, cols // 32)[1], dtype=e8m0, device="cuda"
        )

    def k_groups(cols):  # K-groups scales of S = (cols, rows / 32): (Rp, rows / 32 + 4 G)
        return torch.empty(blocked_shape(cols, 1)[0], rows // 32 + 4 * experts, dtype=e8m0, device="cuda")

    def col_major(r, c):
        return torch.empty(c, r, dtype=e4m3, device="cuda").t()

    with FakeTensorMode():
        ends = torch.empty(experts, dtype=torch.int32, device="cuda")
        q_x, q_gy = (
            torch.empty(rows, k, dtype=e4m3, device="cuda"),
            torch.empty(rows, n, dtype=e4m3, device="cuda"),
        )
        q_w = torch.empty(experts, n, k, dtype=e4m3, device="cuda")
        q_w_n = torch.empty(experts, k, n, dtype=e4m3, device="cuda").transpose(-2, -1)
        s_w = torch.empty(experts, *blocked_shape(n, k // 32), dtype=e8m0, device="cuda")
        s_w_n = torch.empty(experts, *blocked_shape(k, n // 32), dtype=e8m0, device="cuda")
        y = grouped_mm._mx_gemm("fwd", q_x, m_groups(k), q_w, s_w, ends, step)
        grad_x = grouped_mm._mx_gemm("dgrad", q_gy, m_groups(n), q_w_n, s_w_n, ends, step)
        grad_w = grouped_mm._mx_gemm(
            "wgrad", col_major(rows, n), k_groups(n), col_major(rows, k), k_groups(k), ends, step
        )
    assert y.shape == (rows, n) and grad_x.shape == (rows, k) and grad_w.shape == (experts, n, k)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["fp8_rowwise", "bf16"])
def test_gpu_module_no_sync(recipe):
    """GroupedExperts forward + backward (its own padding, the op's aligned path) never sync."""
    module = tb.GroupedExperts(8, 256, 128, recipe=recipe, gemm="auto", device="cuda")
    x = torch.randn(1000, 256, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    ends = torch.tensor(layout_ends(1000, 8, None, seed=7), dtype=torch.int32, device="cuda")
    module(x, ends).sum().backward()  # compile / load the kernels
    with no_sync():
        module(x, ends).sum().backward()


@pytest.mark.gpu
@pytest.mark.parametrize("recipe, gemm", [*GPU_PATHS, ("fp8_rowwise", "auto")])
def test_gpu_torch_compile_fullgraph(recipe, gemm):
    """Forward + backward under torch.compile(fullgraph=True) give the eager results."""
    x, w, grad_y = _inputs(1000, 8, 256, 128, "cuda")
    ends = torch.tensor(layout_ends(1000, 8, None, seed=6), dtype=torch.int32, device="cuda")
    owned = int(ends[-1])
    x.requires_grad_()
    w.requires_grad_()
    eager = [t.detach().clone() for t in _op_step(x, w, ends, grad_y, recipe, gemm)]
    grouped_mm._names_by_index.clear()  # trace "auto"'s device-name lookup cold, as a first call does
    compiled = torch.compile(
        lambda a, b, e: tb.scaled_grouped_mm(a, b, e, recipe=recipe, gemm=gemm), fullgraph=True
    )
    x.grad = w.grad = None
    y = compiled(x, w, ends)
    y.backward(grad_y)
    for got, want in zip(
        (y[:owned], x.grad[:owned], w.grad), (eager[0][:owned], eager[1][:owned], eager[2]), strict=True
    ):
        assert sqnr_db(got, want) >= 60.0  # the same kernels; inductor may fuse the glue


def test_cpu_no_grad_makes_no_wgrad_operand(monkeypatch):
    """Under torch.no_grad the forward quantizes no wgrad (column) operand of x, though w requires a
    gradient; the output equals the training forward's."""
    calls = count_fp8_column_operands(monkeypatch)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(96, 64, generator=gen).bfloat16()
    w = (torch.randn(3, 32, 64, generator=gen) / 8).bfloat16().requires_grad_()
    ends = torch.tensor([16, 48, 96], dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            evaluated = tb.scaled_grouped_mm(x, w, ends)
        assert calls["cols"] == 0
        trained = tb.scaled_grouped_mm(x, w, ends)
    assert calls["cols"] == 1
    assert torch.equal(evaluated.view(torch.uint8), trained.detach().view(torch.uint8))


@pytest.mark.parametrize(
    "gemm,own,cols_alignment,forward,wgrad",
    [
        ("native", "", 16, False, False),
        ("cute", "all", 128, True, True),
        ("cute_2d3d", "2d3d", 16, True, False),
    ],
)
def test_step_names_the_gemms_that_are_ours(monkeypatch, gemm, own, cols_alignment, forward, wgrad):
    """``make_step``: which GEMMs run the project's kernel (forward and dgrad: a 3-D right operand;
    wgrad: 2-D); fp8_rowwise never pads (its 2d x 3d GEMMs take any groups), only its column
    operands come in padded groups (torch's wgrad: 16 rows, none for groups the caller aligned;
    ``gemm="cute"``: 128 rows whatever the caller says); mxfp8 pads unaligned groups."""
    monkeypatch.setattr(grouped_mm, "gemm_path", lambda recipe, device, choice, *call: gemm)
    monkeypatch.setattr(grouped_mm, "torch_gemm_path", lambda recipe, device: "native")
    ends = torch.tensor([4, 8], dtype=torch.int32)
    step = grouped_mm.make_step("fp8_rowwise", gemm, ends, False, "auto", op="test")
    assert (step.own_gemms, step.aligned, step.emulated, step.cols_alignment) == (
        own,
        True,
        False,
        cols_alignment,
    )
    assert (step.runs_own_gemm(3), step.runs_own_gemm(2)) == (forward, wgrad)
    aligned = grouped_mm.make_step("fp8_rowwise", gemm, ends, True, "auto", op="test")
    assert aligned.cols_alignment == (128 if gemm == "cute" else 0)
    if gemm == "native":
        assert not grouped_mm.make_step("mxfp8", gemm, ends, False, "auto", op="test").aligned


def test_step_2d3d_keeps_the_wgrads_torch_path(monkeypatch):
    """``gemm="cute_2d3d"``: the wgrad stays torch's, emulated where torch's path is, and caller-aligned
    groups stay aligned."""
    monkeypatch.setattr(grouped_mm, "gemm_path", lambda recipe, device, choice, *call: "cute_2d3d")
    monkeypatch.setattr(grouped_mm, "torch_gemm_path", lambda recipe, device: "emulated")
    ends = torch.tensor([16, 32], dtype=torch.int32)
    step = grouped_mm.make_step("fp8_rowwise", "cute_2d3d", ends, True, "auto", op="test")
    assert (step.own_gemms, step.aligned, step.emulated) == ("2d3d", True, True)
