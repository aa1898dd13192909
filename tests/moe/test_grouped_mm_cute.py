"""``gemm="cute"``: the project's own sm_90a FP8 grouped GEMM under ``scaled_grouped_mm``,
``GroupedExperts`` and ``MoELayer`` (fp8_rowwise only; what ``"auto"`` runs on the devices of
``grouped_mm.AUTO_OWN_GEMM_DEVICES``, opt-in elsewhere). CPU tests replace the kernel launch
(``torch_bindings.grouped_gemm_sm90._launch_kernel``) with :class:`FakeKernel`, which checks every
operand as the compiled kernel and its ``can_implement`` require (dtypes, compact row-major
layouts, 16-byte alignment, shared sizes, the 2d2d reduction a multiple of 16) and writes the fp32
reference (``grouped_gemm_fp8_rowwise_reference``) on the same operands; the launcher's own size
checks and empty-problem paths run for real. They test the wiring: numerics against fp32 math, no
pad pass on any group layout (the column operands come padded from their quantizer), the gradients
asked for, no wgrad operands without grad. GPU tests (marked; not run where no sm_90 GPU is)
compare the kernel with ``gemm="native"`` on the same inputs, bit-determinism, no host sync, CUDA
graphs and ``torch.compile``.
"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch

import torch_bindings as tb
from cute_kernels.grouped_gemm_sm90 import GroupedGemmSm90Kernel
from tests.conftest import no_sync
from tests.support.grouped_mm_cases import (
    LAYOUTS,
    count_fp8_column_operands,
    fp32_grouped_mm,
    fp32_swiglu_experts,
    layout_ends,
    sqnr_db,
)
from torch_bindings import ep, grouped_gemm_sm90, reference
from torch_bindings.moe import experts, grouped_mm

OP_FLOOR, MODULE_FLOOR = 25.0, 22.0  # dB against fp32 math, as tests/moe/test_grouped_mm.py
# The ragged layouts: M not a multiple of 16 (300, 700, 77, 19), empty first and last groups,
# one-row groups, every row in one group, rows past the last end.
CUTE_LAYOUTS = [
    *LAYOUTS,
    ("empty_ends_m77", 77, 4, [0, 1, 70, 0]),
    ("one_row_groups", 19, 5, [1, 1, 0, 1, 1]),
]
E4M3 = torch.float8_e4m3fn


def _check_operands(form, a, b, scale_a, scale_b, offsets, out) -> None:
    """What the compiled kernel's wrapper and ``can_implement`` require of one launch."""
    for name, t in (("a", a), ("b", b)):
        assert t.dtype == E4M3 and t.is_contiguous(), f"{form} {name}: {t.dtype} strides {t.stride()}"
        assert t.data_ptr() % 16 == 0, f"{form} {name} must be 16-byte aligned"
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        assert t.dtype == torch.float32 and t.is_contiguous(), f"{form} {name}"
    assert offsets.dtype == torch.int32 and offsets.dim() == 1 and offsets.is_contiguous()
    assert out.dtype == torch.bfloat16 and out.is_contiguous()
    groups = offsets.numel()
    if form == "2d3d":
        (m, k), n = a.shape, b.shape[1]
        assert b.shape == (groups, n, k) and scale_a.shape == (m,) and scale_b.shape == (groups, n)
        assert out.shape == (m, n)
    else:
        (n, m), k = a.shape, b.shape[0]
        assert b.shape == (k, m) and scale_a.shape == (groups * n,) and scale_b.shape == (groups * k,)
        assert out.shape == (groups, n, k)
        last = int(offsets[-1])  # past the last end: rows quantized to 0, then the zero padding
        assert not a[:, last:].view(torch.uint8).any() and not b[:, last:].view(torch.uint8).any()
    assert GroupedGemmSm90Kernel.can_implement(form, m, n, k, groups), (form, m, n, k, groups)


class FakeKernel:
    """The kernel launch on CPU: checks the operands, records (form, a's shape, offsets) per call,
    and writes the reference where the kernel writes (2d3d: rows below the last end; the others
    stay NaN, as unwritten rows hold whatever was there)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, list[int]]] = []

    def __call__(self, form, a, b, scale_a, scale_b, offsets, out) -> None:
        _check_operands(form, a, b, scale_a, scale_b, offsets, out)
        self.calls.append((form, tuple(a.shape), offsets.tolist()))
        want = reference.grouped_gemm_fp8_rowwise_reference(form, a, b, scale_a, scale_b, offsets)
        if form == "2d3d":
            owned = max(0, min(int(offsets[-1]), a.shape[0]))
            out.fill_(float("nan"))
            out[:owned] = want[:owned]
        else:
            out.copy_(want)

    def forms(self) -> Counter:
        return Counter(form for form, _, _ in self.calls)


@pytest.fixture
def fake_kernel(monkeypatch) -> FakeKernel:
    """``gemm="cute"`` runs here, on :class:`FakeKernel`."""
    fake = FakeKernel()
    monkeypatch.setattr(grouped_gemm_sm90, "_launch_kernel", fake)
    monkeypatch.setattr(grouped_mm, "cute_gemm_reason", lambda device: None)
    return fake


@pytest.fixture
def pad_calls(monkeypatch) -> list[str]:
    """Names of the pad / unpad ops the op and the expert block call."""
    calls: list[str] = []

    def counting(name: str, original):
        def counted(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)

        return counted

    for module in (grouped_mm, experts):
        for name in ("pad_token_groups", "unpad_token_groups"):
            monkeypatch.setattr(module, name, counting(name, getattr(module, name)))
    return calls


@pytest.fixture(autouse=True)
def _quiet_emulation():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the emulated comparisons' one-time warning
        yield


def _inputs(rows: int, groups: int, k: int, n: int, seed: int = 0, device: str = "cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).bfloat16()
    w = (torch.randn(groups, n, k, generator=gen) / k**0.5).bfloat16()
    grad_y = torch.randn(rows, n, generator=gen).bfloat16()
    return x.to(device), w.to(device), grad_y.to(device)


def _op(x, w, ends, grad_y, gemm: str = "cute", need=(True, True)):
    x = x.clone().requires_grad_(need[0])
    w = w.clone().requires_grad_(need[1])
    y = tb.scaled_grouped_mm(x, w, ends, gemm=gemm)
    y.backward(grad_y)
    return y, x.grad, w.grad


# ----------------------------------------------------------------------------------------------
# scaled_grouped_mm on CPU (fake kernel)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", CUTE_LAYOUTS, ids=[case[0] for case in CUTE_LAYOUTS])
def test_op_matches_fp32_math_without_padding(layout, fake_kernel, pad_calls):
    _, rows, groups, sizes = layout
    ends = layout_ends(rows, groups, sizes)
    x, w, grad_y = _inputs(rows, groups, 64, 96)
    ends_t = torch.tensor(ends, dtype=torch.int32)
    y, grad_x, grad_w = _op(x, w, ends_t, grad_y)
    y_ref, gx_ref, gw_ref = fp32_grouped_mm(x, w, ends, grad_y)
    owned = ends[-1]
    assert y.shape == (rows, 96) and y.dtype == torch.bfloat16
    assert sqnr_db(y[:owned], y_ref[:owned]) >= OP_FLOOR
    assert sqnr_db(grad_x[:owned], gx_ref[:owned]) >= OP_FLOOR
    assert sqnr_db(grad_w, gw_ref) >= OP_FLOOR
    for g, (start, end) in enumerate(zip([0, *ends[:-1]], ends, strict=True)):
        if end == start:
            assert not grad_w[g].any(), f"empty group {g}: grad_w must be 0"
    assert pad_calls == []
    forward, dgrad, wgrad = fake_kernel.calls
    assert [forward[0], dgrad[0], wgrad[0]] == ["2d3d", "2d3d", "2d2d"]
    assert forward[2] == dgrad[2] == ends, "the 2d x 3d GEMMs take the caller's own groups"
    alignment = grouped_mm.CUTE_WGRAD_ALIGNMENT
    padded_end = reference.padded_group_offsets(ends_t, alignment)[1].tolist()
    assert wgrad[2] == padded_end, "the wgrad takes the column operands' padded groups"
    prows = reference.padded_rows(rows, groups, alignment)
    assert wgrad[1] == (96, prows), "grad_y's columns (N, rows of the 128-row padded groups)"


@pytest.mark.parametrize("layout", CUTE_LAYOUTS[:4], ids=[case[0] for case in CUTE_LAYOUTS[:4]])
def test_cute_2d3d_runs_forward_and_dgrad_only(layout, fake_kernel, pad_calls):
    """``gemm="cute_2d3d"``: the kernel for the two 2d x 3d GEMMs on the caller's groups; the wgrad
    is torch's (emulated on CPU) on column operands in 16-row padded groups, as ``"auto"`` runs
    it; no pad pass."""
    _, rows, groups, sizes = layout
    ends = layout_ends(rows, groups, sizes)
    x, w, grad_y = _inputs(rows, groups, 64, 96)
    y, grad_x, grad_w = _op(x, w, torch.tensor(ends, dtype=torch.int32), grad_y, gemm="cute_2d3d")
    y_ref, gx_ref, gw_ref = fp32_grouped_mm(x, w, ends, grad_y)
    owned = ends[-1]
    assert sqnr_db(y[:owned], y_ref[:owned]) >= OP_FLOOR
    assert sqnr_db(grad_x[:owned], gx_ref[:owned]) >= OP_FLOOR
    assert sqnr_db(grad_w, gw_ref) >= OP_FLOOR
    forward, dgrad = fake_kernel.calls
    assert [forward[0], dgrad[0]] == ["2d3d", "2d3d"] and forward[2] == dgrad[2] == ends
    assert pad_calls == []  # the wgrad operands come padded from their quantizer
    emulated = _op(x, w, torch.tensor(ends, dtype=torch.int32), grad_y, gemm="emulated")
    assert torch.equal(grad_w.view(torch.uint8), emulated[2].view(torch.uint8)), (
        "torch's wgrad, same operands"
    )


def test_cute_2d3d_experts_run_the_kernel_for_the_row_gemms(fake_kernel):
    torch.manual_seed(0)
    block = tb.GroupedExperts(4, 64, 32, recipe="fp8_rowwise", gemm="cute_2d3d", device="cpu")
    x = torch.randn(90, 64).bfloat16().requires_grad_()
    ends = torch.tensor([10, 40, 40, 90], dtype=torch.int32)
    block(x, ends).backward(torch.randn(90, 64).bfloat16())
    assert fake_kernel.forms() == Counter({"2d3d": 4}), "w13 and w2: forward and dgrad each"
    assert x.grad is not None and block.w13.grad is not None and block.w2.grad is not None


@pytest.mark.parametrize("need", [(True, False), (False, True)], ids=["x_only", "w_only"])
def test_op_computes_only_the_gradients_asked_for(need, fake_kernel):
    x, w, grad_y = _inputs(100, 3, 32, 48)
    ends = torch.tensor([10, 60, 90], dtype=torch.int32)
    _, grad_x, grad_w = _op(x, w, ends, grad_y, need=need)
    assert (grad_x is not None, grad_w is not None) == need
    want = Counter({"2d3d": 1 + need[0], "2d2d": int(need[1])})
    assert fake_kernel.forms() == +want


def test_op_no_grad_makes_no_wgrad_operand(fake_kernel, monkeypatch):
    calls = count_fp8_column_operands(monkeypatch)
    x, w, _ = _inputs(50, 2, 32, 32)
    ends = torch.tensor([20, 50], dtype=torch.int32)
    with torch.no_grad():
        evaluated = tb.scaled_grouped_mm(x, w.requires_grad_(), ends, gemm="cute")
    assert calls["cols"] == 0 and fake_kernel.forms() == Counter({"2d3d": 1})
    trained = tb.scaled_grouped_mm(x, w, ends, gemm="cute")
    assert calls["cols"] == 1
    assert torch.equal(evaluated[:50].view(torch.uint8), trained.detach()[:50].view(torch.uint8))


def test_op_takes_quantized_tokens(fake_kernel, pad_calls):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(72, 64, generator=gen).bfloat16().requires_grad_()
    ids = torch.randint(0, 4, (72, 1), generator=gen)
    w = (torch.randn(4, 48, 64, generator=gen) / 8).bfloat16().requires_grad_()
    r = ep.dispatch(x, ids, num_experts=4, recipe="fp8_rowwise", alignment=16)
    ends = r.padded_group_end_offsets
    y = tb.scaled_grouped_mm(r.tokens, w, ends, gemm="cute")
    y.sum().backward()
    want = tb.scaled_grouped_mm(r.tokens.dequantized(), w.detach(), ends, recipe="bf16")
    owned = int(ends[-1])
    assert sqnr_db(y[:owned], want[:owned]) >= OP_FLOOR
    assert x.grad is not None and w.grad is not None and pad_calls == []
    assert fake_kernel.forms() == Counter({"2d3d": 2, "2d2d": 1})


# ----------------------------------------------------------------------------------------------
# GroupedExperts and MoELayer on CPU (fake kernel)
# ----------------------------------------------------------------------------------------------

E, D, H = 4, 64, 32
MODULE_LAYOUTS = [(200, (0, 37, 100, 63)), (77, (0, 1, 76, 0)), (160, (0, 0, 160, 0)), (45, (1, 1, 1, 30))]


def _module(gemm: str = "cute", **options):
    torch.manual_seed(0)
    return tb.GroupedExperts(E, D, H, recipe="fp8_rowwise", gemm=gemm, **options)


def _batch(rows: int, sizes, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, D, generator=gen).bfloat16()
    grad = torch.randn(rows, D, generator=gen).bfloat16()
    return x, grad, torch.tensor(layout_ends(rows, E, list(sizes)), dtype=torch.int32)


def _run(module, x, grad, ends, need_x: bool = True, **kwargs):
    x = x.clone().requires_grad_(need_x)
    module.zero_grad(set_to_none=True)
    out = module(x, ends, **kwargs)
    out.backward(grad)
    return out, x.grad, module.w13.grad, module.w2.grad


@pytest.mark.parametrize("rows, sizes", MODULE_LAYOUTS, ids=[f"m{r}" for r, _ in MODULE_LAYOUTS])
def test_experts_match_fp32_math_without_padding(rows, sizes, fake_kernel, pad_calls):
    module = _module()
    x, grad, ends = _batch(rows, sizes)
    got = _run(module, x, grad, ends)
    want = fp32_swiglu_experts(x, module.w13, module.w2, ends.tolist(), grad)
    owned = int(ends[-1])
    assert sqnr_db(got[0][:owned], want[0][:owned]) >= MODULE_FLOOR
    assert sqnr_db(got[1][:owned], want[1][:owned]) >= MODULE_FLOOR
    assert sqnr_db(got[2], want[2]) >= MODULE_FLOOR and sqnr_db(got[3], want[3]) >= MODULE_FLOOR
    assert pad_calls == []
    assert fake_kernel.forms() == Counter({"2d3d": 4, "2d2d": 2})
    padded_end = reference.padded_group_offsets(ends, grouped_mm.CUTE_WGRAD_ALIGNMENT)[1].tolist()
    for form, _, offsets in fake_kernel.calls:  # the wgrads on the column operands' padded groups
        assert offsets == (ends.tolist() if form == "2d3d" else padded_end), form
    # groups_aligned changes nothing on this path (no pad pass either way)
    again = _run(module, x, grad, ends, groups_aligned=True)
    for a, b in zip(got, again, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("frozen", ["x", "w13", "w2"])
def test_experts_compute_only_the_gradients_asked_for(frozen, fake_kernel):
    module = _module()
    x, grad, ends = _batch(200, (0, 37, 100, 63))
    if frozen != "x":
        getattr(module, frozen).requires_grad_(False)
    _run(module, x, grad, ends, need_x=frozen != "x")
    # forward: 2 (2d3d); backward: w2's dgrad always (w13 or x needs it), x's dgrad, two wgrads
    want = {"x": {"2d3d": 3, "2d2d": 2}, "w13": {"2d3d": 4, "2d2d": 1}, "w2": {"2d3d": 4, "2d2d": 1}}
    assert fake_kernel.forms() == Counter(want[frozen])


def test_experts_no_grad_makes_no_wgrad_operands(fake_kernel, monkeypatch):
    module = _module()
    x, _, ends = _batch(77, (0, 1, 76, 0))
    calls = count_fp8_column_operands(monkeypatch)
    with torch.no_grad():
        evaluated = module(x, ends)
    assert calls["cols"] == 0 and fake_kernel.forms() == Counter({"2d3d": 2})
    trained = module(x, ends)
    assert calls["cols"] == 2
    owned = int(ends[-1])
    assert torch.equal(evaluated[:owned].view(torch.uint8), trained.detach()[:owned].view(torch.uint8))


def test_experts_take_quantized_tokens_from_a_dispatch(fake_kernel, pad_calls):
    """An FP8 dispatch's tokens into the cute block: close to the bf16 dispatch feeding it."""
    dim = 128
    torch.manual_seed(0)
    module = tb.GroupedExperts(E, dim, H, recipe="fp8_rowwise", gemm="cute")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(90, dim, generator=gen).bfloat16()
    ids = torch.randint(0, E, (90, 2), generator=gen)
    weights = torch.rand(90, 2, generator=gen)
    g = torch.randn(90, dim, generator=gen).bfloat16()

    def layer(dispatch_recipe):
        xs = x.clone().requires_grad_()
        module.zero_grad(set_to_none=True)
        r = ep.dispatch(xs, ids, num_experts=E, recipe=dispatch_recipe, alignment=16)
        tokens = r.q if dispatch_recipe == "bf16" else r.tokens
        ep.combine(module(tokens, r.padded_group_end_offsets), r, weights).backward(g)
        return xs.grad, module.w13.grad, module.w2.grad

    for a, b in zip(layer("fp8_rowwise"), layer("bf16"), strict=True):
        assert sqnr_db(a, b) >= 25.0
    assert pad_calls == []


@pytest.mark.parametrize("gemm, forms", [("cute", {"2d3d": 4, "2d2d": 2}), ("cute_2d3d", {"2d3d": 4})])
def test_moe_layer_passes_gemm_through(gemm, forms, fake_kernel):
    torch.manual_seed(0)
    layer = tb.MoELayer(64, 32, 4, 2, recipe="fp8_rowwise", alignment=16, gemm=gemm)
    emulated = tb.MoELayer(64, 32, 4, 2, recipe="fp8_rowwise", alignment=16, gemm="emulated")
    emulated.load_state_dict(layer.state_dict())
    assert layer.experts.gemm == gemm
    x = torch.randn(40, 64).bfloat16()
    grads = []
    for module in (layer, emulated):
        xs = x.clone().requires_grad_()
        module(xs).float().square().sum().backward()
        grads.append((xs.grad, module.experts.w13.grad, module.experts.w2.grad))
    assert fake_kernel.forms() == Counter(forms)
    for a, b in zip(*grads, strict=True):
        assert sqnr_db(a, b) >= MODULE_FLOOR


def test_moe_layer_with_cute_pads_groups_to_128_by_default(fake_kernel):
    """``gemm="cute"`` without an alignment: the dispatch pads every group to 128 rows, so the
    project's wgrad masks nothing; the other GEMM paths keep 32; a given alignment is kept."""
    from torch_bindings.moe.layer import default_alignment

    assert tb.MoELayer(64, 32, 4, 2, gemm="cute").alignment == 128 == default_alignment("cute")
    for gemm in ("auto", "cute_2d3d", "emulated"):
        assert tb.MoELayer(64, 32, 4, 2, gemm=gemm).alignment == 32 == default_alignment(gemm)
    assert tb.MoELayer(64, 32, 4, 2, gemm="cute", alignment=16).alignment == 16
    layer = tb.MoELayer(64, 32, 4, 2, gemm="cute")
    layer(torch.randn(40, 64).bfloat16())
    ends = fake_kernel.calls[0][2]
    assert ends and all(e % 128 == 0 for e in ends), ends
    # routed_experts takes the same default from its experts' gemm
    from torch_bindings.moe import routed_experts

    fake_kernel.calls.clear()
    x, idx, weights = torch.randn(40, 64).bfloat16(), torch.randint(0, 4, (40, 2)), torch.rand(40, 2)
    routed_experts(x, idx, weights, layer.experts, num_experts=4, dispatch_recipe="fp8_rowwise")
    ends = fake_kernel.calls[0][2]
    assert ends and all(e % 128 == 0 for e in ends), ends


# ----------------------------------------------------------------------------------------------
# The choice, errors, capabilities, the launcher's checks
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gemm", ["cute", "cute_2d3d"])
def test_cute_on_cpu_is_a_clear_error(gemm):
    x, w, _ = _inputs(32, 2, 32, 32)
    ends = torch.tensor([16, 32], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=f"gemm='{gemm}' cannot run here: tensors are on cpu"):
        tb.scaled_grouped_mm(x, w, ends, gemm=gemm)
    module = _module(gemm)  # the options are valid; the device is checked at the call
    with pytest.raises(RuntimeError, match=f"gemm='{gemm}' cannot run here"):
        module(torch.zeros(8, D, dtype=torch.bfloat16), torch.tensor([0, 2, 4, 8], dtype=torch.int32))


@pytest.mark.parametrize("gemm", ["cute", "cute_2d3d"])
@pytest.mark.parametrize("recipe", ["mxfp8", "bf16"])
def test_cute_runs_fp8_rowwise_only(recipe, gemm):
    x, w, _ = _inputs(32, 2, 32, 32)
    ends = torch.tensor([16, 32], dtype=torch.int32)
    with pytest.raises(ValueError, match=f"scaled_grouped_mm: gemm='{gemm}' runs recipe"):
        tb.scaled_grouped_mm(x, w, ends, recipe=recipe, gemm=gemm)
    with pytest.raises(ValueError, match=f"GroupedExperts: gemm='{gemm}' runs recipe"):
        tb.GroupedExperts(E, D, H, recipe=recipe, gemm=gemm)
    with pytest.raises(ValueError, match=f"gemm='{gemm}' runs recipe"):
        tb.MoELayer(D, H, E, 2, recipe=recipe, gemm=gemm)


@pytest.mark.parametrize("gemm", ["cute", "cute_2d3d"])
def test_cute_takes_at_most_256_experts(gemm, fake_kernel):
    x, w, _ = _inputs(16, 257, 16, 16)
    ends = torch.full((257,), 16, dtype=torch.int32)
    with pytest.raises(ValueError, match="at most 256 experts, group_end_offsets has 257"):
        tb.scaled_grouped_mm(x, w, ends, gemm=gemm)
    assert fake_kernel.calls == []


def test_auto_keeps_torchs_gemm_where_not_measured(fake_kernel):
    """Where the kernel could run but the device is not one ``"auto"`` picks it on (here: the CPU),
    ``gemm="auto"`` keeps torch's GEMM or the emulation."""
    x, w, grad_y = _inputs(48, 2, 32, 32)
    ends = torch.tensor([16, 48], dtype=torch.int32)
    _op(x, w, ends, grad_y, gemm="auto")
    assert fake_kernel.calls == []
    assert grouped_mm.gemm_path("fp8_rowwise", torch.device("cpu"), "auto") == "emulated"
    assert grouped_mm.gemm_path_quiet("fp8_rowwise", torch.device("cpu")) == "emulated"


@pytest.mark.parametrize(
    "name, recipe, picks",
    [
        ("NVIDIA H200", "fp8_rowwise", True),
        ("NVIDIA H100 80GB HBM3", "fp8_rowwise", False),
        ("NVIDIA H200", "mxfp8", False),
        ("NVIDIA H200", "bf16", False),
    ],
)
def test_auto_picks_the_own_gemm_on_the_measured_devices(monkeypatch, name, recipe, picks):
    monkeypatch.setattr(grouped_mm, "cute_gemm_reason", lambda device: None)
    monkeypatch.setattr(grouped_mm, "_device_name", lambda index: name)
    cuda = torch.device("cuda", 0)
    assert grouped_mm.auto_runs_own_gemm(recipe, cuda) is picks
    if picks:  # (otherwise torch's path, which asks the CUDA runtime)
        assert grouped_mm.gemm_path_quiet(recipe, cuda) == "cute"
    assert not grouped_mm.auto_runs_own_gemm(recipe, torch.device("cpu"))
    monkeypatch.setattr(grouped_mm, "cute_gemm_reason", lambda device: "no CuTeDSL")
    assert not grouped_mm.auto_runs_own_gemm(recipe, cuda)


def test_device_name_traces_cold_under_fullgraph_compile(monkeypatch):
    """``"auto"``'s device-name lookup is a constant of a ``torch.compile`` trace, also when no eager
    call filled its cache (dynamo cannot trace ``torch.cuda.get_device_name``'s string)."""
    from types import SimpleNamespace

    # the real get_device_name on a CPU machine: only the properties it reads are faked
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(name="NVIDIA H200")
    )
    monkeypatch.setattr(grouped_mm, "_names_by_index", {})
    torch._dynamo.reset()

    def fn(x):
        return x + 1 if grouped_mm._device_name(0) in grouped_mm.AUTO_OWN_GEMM_DEVICES else x

    assert torch.equal(torch.compile(fn, fullgraph=True)(torch.zeros(3)), torch.ones(3))


def test_auto_runs_the_own_gemm_where_it_picks_it(fake_kernel, monkeypatch):
    """Where ``"auto"`` picks the project's GEMM, a call runs what ``gemm="cute"`` runs, bit for bit;
    with more experts than the kernel takes, or ``backend="reference"``, it runs torch's GEMM."""
    monkeypatch.setattr(grouped_mm, "auto_runs_own_gemm", lambda recipe, device: recipe == "fp8_rowwise")
    x, w, grad_y = _inputs(300, 4, 64, 32)
    ends = torch.tensor(layout_ends(300, 4, [0, 37, 200, 63]), dtype=torch.int32)
    auto = _op(x, w, ends, grad_y, gemm="auto")
    assert fake_kernel.forms() == Counter({"2d3d": 2, "2d2d": 1})
    cute = _op(x, w, ends, grad_y, gemm="cute")
    owned = int(ends[-1])
    for name, a, b in zip(("y", "grad_x", "grad_w"), auto, cute, strict=True):
        rows = slice(None) if name == "grad_w" else slice(0, owned)
        assert torch.equal(a[rows].view(torch.uint8), b[rows].view(torch.uint8)), name
    step = grouped_mm.make_step("fp8_rowwise", "auto", ends, False, "auto", op="test")
    assert (step.own_gemms, step.cols_alignment) == ("all", grouped_mm.CUTE_WGRAD_ALIGNMENT)
    many = torch.full((257,), 16, dtype=torch.int32)
    for ends_, backend in ((many, "auto"), (ends, "reference")):
        step = grouped_mm.make_step("fp8_rowwise", "auto", ends_, False, backend, op="test")
        assert (step.own_gemms, step.emulated) == ("", True)  # torch's GEMM: here its emulation
    assert grouped_mm.make_step("bf16", "auto", ends, False, "auto", op="test").own_gemms == ""


def test_capabilities_report_the_own_gemm(monkeypatch):
    cpu = tb.capabilities("cpu")
    assert cpu.cute_gemm == {"fp8_rowwise": "unavailable"} and "gemm='cute'" in str(cpu)
    monkeypatch.setattr(grouped_mm, "cute_gemm_reason", lambda device: None)
    here = tb.capabilities("cpu")
    assert here.cute_gemm == {"fp8_rowwise": "opt-in"}
    assert here.gemm["fp8_rowwise"] == "emulated", "auto keeps torch's path where it does not pick ours"
    monkeypatch.setattr(grouped_mm, "auto_runs_own_gemm", lambda recipe, device: recipe == "fp8_rowwise")
    picked = tb.capabilities("cpu")
    assert picked.cute_gemm == {"fp8_rowwise": "auto"} and picked.gemm["fp8_rowwise"] == "cute"
    assert picked.gemm["mxfp8"] == "emulated"


@pytest.mark.parametrize(
    "form, a, b, scales, match",
    [
        ("2d2d", (8, 20), (16, 20), (16, 32), r"M=20 \(a.shape\[1\] and b.shape\[1\], the reduction\) must"),
        ("2d2d", (8, 32), (12, 32), (16, 24), r"K=12 \(b.shape\[0\], out's row length\)"),
        ("2d3d", (32, 24), (2, 16, 24), (32, (2, 16)), r"K=24 \(a.shape\[1\], the reduction\)"),
        ("2d3d", (32, 32), (2, 12, 32), (32, (2, 12)), r"N=12 \(b.shape\[1\], y's row length\)"),
    ],
)
def test_launcher_names_the_size_it_cannot_take(form, a, b, scales, match, fake_kernel):
    """Raised before any launch (the fake records none)."""
    offsets = torch.tensor([4, 8], dtype=torch.int32)
    args = [torch.zeros(a, dtype=E4M3), torch.zeros(b, dtype=E4M3), *map(torch.ones, scales)]
    with pytest.raises(ValueError, match=match):
        grouped_gemm_sm90.grouped_gemm_fp8_rowwise_sm90(form, *args, offsets)
    many = torch.zeros(257, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"E=257 groups \(group_end_offsets' length\)"):
        grouped_gemm_sm90.check_sizes("2d3d", 32, 32, 32, many.numel())
    assert fake_kernel.calls == []


# ----------------------------------------------------------------------------------------------
# GPU (sm_90): the kernel itself against torch's GEMM
# ----------------------------------------------------------------------------------------------

# cute and native run the same quantized values (the wgrad columns over the same token groups, laid
# out in 128- or 16-row padded groups); they differ only in accumulation order and where rounding
# happens.
NATIVE_FLOOR = 35.0
GPU_DIMS = [(256, 64), (64, 256), (128, 128)]


def _sm90() -> None:
    if grouped_mm.cute_gemm_reason(torch.device("cuda")) is not None:
        pytest.skip("gemm='cute' needs an sm_90 GPU")


def _same_bits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), what


@pytest.mark.gpu
@pytest.mark.parametrize("dims", GPU_DIMS, ids=[f"k{k}n{n}" for k, n in GPU_DIMS])
@pytest.mark.parametrize("layout", CUTE_LAYOUTS, ids=[case[0] for case in CUTE_LAYOUTS])
def test_gpu_cute_matches_native_and_is_deterministic(layout, dims):
    _sm90()
    _, rows, groups, sizes = layout
    ends = layout_ends(rows, groups, sizes)
    x, w, grad_y = _inputs(rows, groups, *dims, device="cuda")
    ends_t = torch.tensor(ends, dtype=torch.int32, device="cuda")
    with no_sync():
        cute = _op(x, w, ends_t, grad_y, gemm="cute")
    again = _op(x, w, ends_t, grad_y, gemm="cute")
    native = _op(x, w, ends_t, grad_y, gemm="native")
    want = fp32_grouped_mm(x, w, ends, grad_y)
    owned = ends[-1]
    names = ("y", "grad_x", "grad_w")
    for name, got, other, again_t, exact in zip(names, cute, native, again, want, strict=True):
        cut = slice(None) if name == "grad_w" else slice(0, owned)
        assert sqnr_db(got[cut], other[cut]) >= NATIVE_FLOOR, name
        assert sqnr_db(got[cut], exact[cut]) >= OP_FLOOR, name
        _same_bits(got[cut], again_t[cut], f"{name} run to run")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", CUTE_LAYOUTS, ids=[case[0] for case in CUTE_LAYOUTS])
def test_gpu_cute_2d3d_matches_native_without_sync(layout):
    """``gemm="cute_2d3d"``: the kernel's forward and dgrad, torch's wgrad (the same bytes as
    ``"native"``'s: the same operands and GEMM)."""
    _sm90()
    _, rows, groups, sizes = layout
    ends = layout_ends(rows, groups, sizes)
    x, w, grad_y = _inputs(rows, groups, *GPU_DIMS[0], device="cuda")
    ends_t = torch.tensor(ends, dtype=torch.int32, device="cuda")
    _op(x, w, ends_t, grad_y, gemm="cute_2d3d")  # compile / load the kernels
    with no_sync():
        hybrid = _op(x, w, ends_t, grad_y, gemm="cute_2d3d")
    native = _op(x, w, ends_t, grad_y, gemm="native")
    owned = ends[-1]
    for name, got, other in zip(("y", "grad_x"), hybrid[:2], native[:2], strict=True):
        assert sqnr_db(got[:owned], other[:owned]) >= NATIVE_FLOOR, name
    _same_bits(hybrid[2], native[2], "grad_w: torch's wgrad on the same operands")


@pytest.mark.gpu
def test_gpu_cute_no_sync_cuda_graph_and_compile():
    _sm90()
    x, w, grad_y = _inputs(1000, 8, 256, 128, device="cuda")
    ends = torch.tensor(layout_ends(1000, 8, None, seed=5), dtype=torch.int32, device="cuda")
    owned = int(ends[-1])
    x.requires_grad_()
    w.requires_grad_()

    def step():
        x.grad = w.grad = None
        y = tb.scaled_grouped_mm(x, w, ends, gemm="cute")
        y.backward(grad_y)
        return y, x.grad, w.grad

    step()  # compile / load the kernels
    with no_sync():  # torch.cuda.set_sync_debug_mode("error")
        eager = [t.detach().clone() for t in step()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm up on a side stream, results dropped
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    x.grad = w.grad = None
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    for got, want in zip(captured, eager, strict=True):
        cut = slice(None) if got.dim() == 3 else slice(0, owned)
        _same_bits(got[cut], want[cut], "graph replay")
    compiled = torch.compile(lambda a, b, e: tb.scaled_grouped_mm(a, b, e, gemm="cute"), fullgraph=True)
    x.grad = w.grad = None
    y = compiled(x, w, ends)
    y.backward(grad_y)
    for got, want in zip((y, x.grad, w.grad), eager, strict=True):
        cut = slice(None) if got.dim() == 3 else slice(0, owned)
        assert sqnr_db(got[cut], want[cut]) >= 60.0


@pytest.mark.gpu
def test_gpu_cute_experts_match_native_without_sync():
    _sm90()
    torch.manual_seed(0)
    native = tb.GroupedExperts(8, 256, 128, recipe="fp8_rowwise", gemm="native", device="cuda")
    cute = tb.GroupedExperts.from_weights(native.w13, native.w2, gemm="cute")
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3001, 256, generator=gen).bfloat16().cuda()
    grad = torch.randn(3001, 256, generator=gen).bfloat16().cuda()
    ends = torch.tensor(layout_ends(3001, 8, None, seed=3), dtype=torch.int32, device="cuda")
    owned = int(ends[-1])
    _run(cute, x, grad, ends)  # compile / load the kernels
    with no_sync():
        got = [t.clone() for t in _run(cute, x, grad, ends)]
    again = _run(cute, x, grad, ends)
    want = [t.clone() for t in _run(native, x, grad, ends)]
    for i, (a, b, c) in enumerate(zip(got, want, again, strict=True)):
        cut = slice(0, owned) if i < 2 else slice(None)
        assert sqnr_db(a[cut], b[cut]) >= NATIVE_FLOOR - 5.0, i  # six GEMMs and a SwiGLU chained
        _same_bits(a[cut], c[cut], f"output {i} run to run")


@pytest.mark.gpu
def test_gpu_capabilities_report_cute():
    caps = tb.capabilities("cuda")
    cuda = torch.device("cuda")
    runs = grouped_mm.cute_gemm_reason(cuda) is None
    picked = grouped_mm.auto_runs_own_gemm("fp8_rowwise", cuda)
    assert caps.cute_gemm == {"fp8_rowwise": "auto" if picked else "opt-in" if runs else "unavailable"}
    assert caps.gemm["fp8_rowwise"] == ("cute" if picked else "native")
    assert picked == (torch.cuda.get_device_name() in grouped_mm.AUTO_OWN_GEMM_DEVICES and runs)
