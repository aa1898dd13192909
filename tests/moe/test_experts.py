"""The expert block (SPEC section 8): fused gate/up layout, precision in (fp32, autocast), only the
gradients asked for, the weight cache, quantized tokens from a dispatch, constructors, errors.
CPU tests run the reference quantizers and the emulated GEMMs; GPU tests (marked) the kernels with
torch's FP8 GEMM and with ``gemm="auto"``'s (see ``DEVICES``)."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_bindings as tb
from tests.support.grouped_mm_cases import (
    count_fp8_column_operands,
    fp32_swiglu_experts,
    layout_ends,
    sqnr_db,
)
from torch_bindings import ep
from torch_bindings.moe import experts

# "cuda" runs torch's FP8 GEMM (gemm="native"); "cuda:0" the same GPU with gemm="auto": the
# project's own GEMM where auto picks it (grouped_mm.AUTO_OWN_GEMM_DEVICES), else torch's again.
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.gpu),
    pytest.param("cuda:0", marks=pytest.mark.gpu, id="cuda-auto"),
]
GEMM = {"cpu": "auto", "cuda": "native", "cuda:0": "auto"}


def device_recipes(recipes: list[str]) -> list:
    """(device, recipe) params of ``DEVICES`` x ``recipes``, "cuda-auto" with fp8_rowwise only: the
    other recipes run ``gemm="auto"`` on "cuda" already (``_module``), so their "cuda-auto" cases
    would repeat those."""
    params = []
    for device in DEVICES:
        value, marks, name = (
            (device, (), device) if isinstance(device, str) else (*device.values, device.marks, device.id)
        )
        for recipe in recipes:
            if name == "cuda-auto" and recipe != "fp8_rowwise":
                continue
            params.append(pytest.param(value, recipe, marks=marks, id=f"{name or value}-{recipe}"))
    return params


E, D, H = 4, 64, 32
# SQNR floors (dB) against fp32 math: three chained FP8 GEMMs and a SwiGLU (the 22);
# bf16 operands only round.
FLOOR = {"fp8_rowwise": 22.0, "mxfp8": 22.0, "bf16": 35.0}


@pytest.fixture(autouse=True)
def _quiet_emulation():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the emulated GEMMs' one-time warning
        yield


def _module(device, recipe, *, dtype=torch.bfloat16, seed=0, **options):
    torch.manual_seed(seed)
    gemm = GEMM[device] if recipe == "fp8_rowwise" else "auto"
    return tb.GroupedExperts(E, D, H, recipe=recipe, gemm=gemm, device=device, dtype=dtype, **options)


def _batch(device, rows=200, sizes=(0, 37, 100, 63), dtype=torch.bfloat16, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, D, generator=gen).to(dtype).to(device)
    grad = torch.randn(rows, D, generator=gen).to(dtype).to(device)
    ends = torch.tensor(layout_ends(rows, E, list(sizes)), dtype=torch.int32, device=device)
    return x, grad, ends


def _run(module, x, grad, ends, **kwargs):
    x = x.clone().requires_grad_(x.is_floating_point())
    module.zero_grad(set_to_none=True)
    out = module(x, ends, **kwargs)
    out.backward(grad.to(out.dtype))
    return out, x.grad, module.w13.grad, module.w2.grad


def _assert_close_to_fp32(got, module, x, grad, ends, floor):
    want = fp32_swiglu_experts(x, module.w13, module.w2, ends.tolist(), grad)
    owned = int(ends[-1])
    assert sqnr_db(got[0][:owned], want[0][:owned]) >= floor
    assert sqnr_db(got[1][:owned], want[1][:owned]) >= floor
    assert sqnr_db(got[2], want[2]) >= floor and sqnr_db(got[3], want[3]) >= floor


def _same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), what


@pytest.mark.parametrize(("device", "recipe"), device_recipes(["fp8_rowwise", "mxfp8", "bf16"]))
def test_fp32_parameters_and_activations(device, recipe):
    """fp32 master weights and fp32 activations: read directly, output and gradients in fp32."""
    module = _module(device, recipe, dtype=torch.float32)
    x, grad, ends = _batch(device, dtype=torch.float32)
    got = _run(module, x, grad, ends)
    assert all(t.dtype == torch.float32 for t in got)
    _assert_close_to_fp32(got, module, x, grad, ends, FLOOR[recipe])


@pytest.mark.parametrize(("device", "recipe"), device_recipes(["fp8_rowwise", "bf16"]))
def test_autocast_bf16(device, recipe):
    """Under torch.autocast(bfloat16) with fp32 parameters and activations: bf16 output, gradients in
    each input's dtype (fp32)."""
    module = _module(device, recipe, dtype=torch.float32)
    x, grad, ends = _batch(device, dtype=torch.float32)
    x = x.clone().requires_grad_()
    with torch.autocast(device, dtype=torch.bfloat16):
        out = module(x, ends)
    assert out.dtype == torch.bfloat16
    out.backward(grad.bfloat16())
    assert x.grad.dtype == module.w13.grad.dtype == module.w2.grad.dtype == torch.float32
    _assert_close_to_fp32(
        (out, x.grad, module.w13.grad, module.w2.grad), module, x, grad, ends, FLOOR[recipe]
    )


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_recipe_equals_two_grouped_mms_on_the_fused_weight(device):
    """The bf16 block is the two-GEMM computation on w13 (one dgrad for x, no sum of two parts)."""
    module = _module(device, "bf16")
    x, grad, ends = _batch(device)
    got = _run(module, x, grad, ends)
    xs = x.clone().requires_grad_()
    w13, w2 = module.w13.detach().clone().requires_grad_(), module.w2.detach().clone().requires_grad_()
    h13 = tb.scaled_grouped_mm(xs, w13, ends, recipe="bf16")
    h = torch.nn.functional.silu(h13[:, :H]) * h13[:, H:]
    out = tb.scaled_grouped_mm(h, w2, ends, recipe="bf16")
    out.backward(grad)
    owned = int(ends[-1])
    _same(got[0][:owned], out[:owned], "out")
    _same(got[1][:owned], xs.grad[:owned], "grad x")
    _same(got[2], w13.grad, "grad w13")
    _same(got[3], w2.grad, "grad w2")


@pytest.mark.parametrize(("device", "recipe"), device_recipes(["fp8_rowwise", "mxfp8", "bf16"]))
def test_only_the_gradients_asked_for(device, recipe, monkeypatch):
    """A frozen expert weight gets no gradient (its wgrad is not computed); a first layer's x needs
    none (its dgrad is not computed); what is computed equals the full backward."""
    module = _module(device, recipe)
    x, grad, ends = _batch(device)
    full = _run(module, x, grad, ends)
    module.w13.requires_grad_(False)
    module.zero_grad(set_to_none=True)
    out = module(x, ends)  # x needs no gradient: no dgrad of x, and w13 frozen: no wgrad of w13
    calls = {"wgrad": 0}
    original = experts.Fp8Rowwise.wgrad_mm

    def counted(self, a, b, e):
        calls["wgrad"] += 1
        return original(self, a, b, e)

    monkeypatch.setattr(experts.Fp8Rowwise, "wgrad_mm", counted)
    out.backward(grad)
    assert module.w13.grad is None
    _same(module.w2.grad, full[3], "grad w2")
    if recipe == "fp8_rowwise":
        assert calls["wgrad"] == 1  # w2's only


@pytest.mark.parametrize("device", DEVICES)
def test_backward_frees_w13s_fp8_copy_before_its_wgrad(device, monkeypatch):
    """With the weight cache off, w13's dgrad operand (an FP8 copy of the weight) is made and dropped
    before w13's wgrad allocates the largest gradient of the backward, so the two never hold memory
    together (notes/expert-block.md, peak memory)."""
    import weakref

    module = _module(device, "fp8_rowwise", weight_cache=False)
    x, grad, ends = _batch(device)
    weights, alive_at_wgrad = [], []
    original_weight, original_wgrad = experts.Fp8Rowwise.weight, experts.Fp8Rowwise.wgrad_mm

    def weight(self, w, layout):
        operands = original_weight(self, w, layout)
        if layout == "dgrad":
            weights.append(weakref.ref(operands[0]))
        return operands

    def wgrad(self, a, b, e):
        alive_at_wgrad.append((len(weights), sum(ref() is not None for ref in weights)))
        return original_wgrad(self, a, b, e)

    monkeypatch.setattr(experts.Fp8Rowwise, "weight", weight)
    monkeypatch.setattr(experts.Fp8Rowwise, "wgrad_mm", wgrad)
    _run(module, x, grad, ends)
    assert len(weights) == 2  # w2's, then w13's
    # each wgrad after its weight's dgrad, the dgrad's copy gone
    assert alive_at_wgrad == [(1, 0), (2, 0)]


@pytest.mark.parametrize(("device", "recipe"), device_recipes(["fp8_rowwise", "mxfp8"]))
def test_w2s_gradient_and_h13_are_done_before_w13s_wgrad(device, recipe, monkeypatch):
    """Two autograd nodes: w2's gradient is accumulated into ``.grad`` and h13 (saved by the down
    node) is freed before w13's wgrad allocates its gradient, as bf16's per-op autograd does."""
    import weakref

    module = _module(device, recipe)
    x, grad, ends = _batch(device)
    cls = experts.RECIPES[recipe]
    h13, events = [], []
    original_forward, original_wgrad = cls.forward_mm, cls.wgrad_mm

    def forward_mm(self, a, w, e):
        out = original_forward(self, a, w, e)
        if not h13:
            h13.append(weakref.ref(out))  # the first forward GEMM's output is h13
        return out

    def wgrad_mm(self, a, b, e):
        events.append(("wgrad", h13[0]() is None))
        return original_wgrad(self, a, b, e)

    monkeypatch.setattr(cls, "forward_mm", forward_mm)
    monkeypatch.setattr(cls, "wgrad_mm", wgrad_mm)
    module.w2.register_post_accumulate_grad_hook(lambda _: events.append(("w2 accumulated", None)))
    got = _run(module, x, grad, ends)
    assert events == [("wgrad", False), ("w2 accumulated", None), ("wgrad", True)]
    monkeypatch.undo()
    _same(got[2], _run(module, x, grad, ends)[2], "grad w13")


@pytest.mark.parametrize(("device", "recipe"), device_recipes(["fp8_rowwise", "mxfp8"]))
def test_gradient_of_w2_alone_makes_no_gate_up_operands(device, recipe, monkeypatch):
    """``torch.autograd.grad(out, [w2])`` prunes the gate/up node: the down node's backward makes no
    grad_h13 operands (nothing would take them from the handoff) and w2's gradient is the full
    backward's."""
    module = _module(device, recipe)
    x, grad, ends = _batch(device)
    full = _run(module, x, grad, ends)
    calls = {"swiglu_backward": 0}
    cls = experts.RECIPES[recipe]
    original = cls.swiglu_backward

    def counted(self, *args, **kwargs):
        calls["swiglu_backward"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "swiglu_backward", counted)
    out = module(x.clone().requires_grad_(), ends)
    (grad_w2,) = torch.autograd.grad(out, [module.w2], grad)
    assert calls["swiglu_backward"] == 0
    _same(grad_w2, full[3], "grad w2")


@pytest.mark.parametrize(("device", "recipe"), device_recipes(["fp8_rowwise", "mxfp8"]))
def test_retained_graph_and_checkpoint_give_the_same_gradients(device, recipe):
    """A second backward through a retained graph, and the block under torch.utils.checkpoint
    (reentrant and not), give the plain backward's bytes: grad_h13's operands are handed between
    the two nodes afresh every time."""
    import torch.utils.checkpoint as checkpoint

    module = _module(device, recipe)
    x, grad, ends = _batch(device)
    plain = _run(module, x, grad, ends)
    xr = x.clone().requires_grad_()
    module.zero_grad(set_to_none=True)
    out = module(xr, ends)
    out.backward(grad, retain_graph=True)
    first = (xr.grad, module.w13.grad, module.w2.grad)
    xr.grad = None
    module.zero_grad(set_to_none=True)
    out.backward(grad)
    second = (xr.grad, module.w13.grad, module.w2.grad)
    for a, b, c, what in zip(first, second, plain[1:], ("x", "w13", "w2"), strict=True):
        _same(a, c, f"retained graph, first backward, grad {what}")
        _same(b, c, f"retained graph, second backward, grad {what}")
    for reentrant in (False, True):
        xc = x.clone().requires_grad_()
        module.zero_grad(set_to_none=True)
        out = checkpoint.checkpoint(module, xc, ends, use_reentrant=reentrant)
        out.backward(grad)
        _same(out.detach(), plain[0].detach(), f"checkpoint (reentrant={reentrant}) output")
        got = (xc.grad, module.w13.grad, module.w2.grad)
        for a, c, what in zip(got, plain[1:], ("x", "w13", "w2"), strict=True):
            _same(a, c, f"checkpoint (reentrant={reentrant}), grad {what}")


@pytest.mark.parametrize("device", DEVICES)
def test_weight_cache_reuses_and_invalidates(device, monkeypatch):
    """Weights quantize once per value: a second call (micro-batch, recomputation) reuses the
    operands, an in-place update (an optimizer step) recomputes them; results equal the uncached
    module's; opt-out quantizes every call. Cached trainable weights get both layouts from one
    dual pass; uncached ones one layout per GEMM."""
    calls = {"single": 0, "both": 0}
    single, both = experts.Fp8Rowwise.weight, experts.Fp8Rowwise.weight_both

    def counted_single(self, w, layout):
        calls["single"] += 1
        return single(self, w, layout)

    def counted_both(self, w):
        calls["both"] += 1
        return both(self, w)

    monkeypatch.setattr(experts.Fp8Rowwise, "weight", counted_single)
    monkeypatch.setattr(experts.Fp8Rowwise, "weight_both", counted_both)
    cached, plain = _module(device, "fp8_rowwise"), _module(device, "fp8_rowwise", weight_cache=False)
    x, grad, ends = _batch(device)
    first = _run(cached, x, grad, ends)
    assert calls == {"single": 0, "both": 2} and cached.weight_cache_bytes() > 0  # w13, w2
    second = _run(cached, x, grad, ends)
    assert calls == {"single": 0, "both": 2}
    for a, b in zip(first, second, strict=True):
        _same(a, b, "cached call")
    with torch.no_grad():
        cached.w2.mul_(0.5)  # the optimizer's in-place update
    third = _run(cached, x, grad, ends)
    assert calls == {"single": 0, "both": 3}  # w2 again, w13 from the cache
    with torch.no_grad():
        plain.w2.mul_(0.5)
    reference = _run(plain, x, grad, ends)
    assert calls == {"single": 4, "both": 3} and plain.weight_cache_bytes() == 0
    for a, b in zip(third, reference, strict=True):
        _same(a, b, "cached against uncached")


def _train_steps(module, x, grad, ends, make_optimizer, steps=3):
    """``steps`` optimizer steps of ``module``; returns the outputs and gradients of every step."""
    optimizer = make_optimizer(module.parameters())
    results = []
    for _ in range(steps):
        results.append(_run(module, x, grad, ends))
        optimizer.step()
    return results


def _optimizers():
    adamw = torch.optim.AdamW
    return {
        "adamw_fused": lambda params: adamw(params, lr=1e-2, fused=True),
        "adamw_foreach": lambda params: adamw(params, lr=1e-2, foreach=True),
        "sgd_for_loop": lambda params: torch.optim.SGD(params, lr=1e-1, foreach=False),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("optimizer", sorted(_optimizers()))
def test_weight_cache_follows_optimizer_steps(device, optimizer):
    """Every torch.optim step invalidates the cache, also the fused optimizers, which update the
    parameters without moving their version counters: a cached module trains bit-identically to an
    uncached one."""
    make = _optimizers()[optimizer]
    x, grad, ends = _batch(device)
    cached = _train_steps(_module(device, "fp8_rowwise"), x, grad, ends, make)
    plain = _train_steps(_module(device, "fp8_rowwise", weight_cache=False), x, grad, ends, make)
    for step, (got, want) in enumerate(zip(cached, plain, strict=True)):
        for a, b in zip(got, want, strict=True):
            _same(a, b, f"step {step}")


@pytest.mark.parametrize("device", DEVICES)
def test_weight_cache_after_data_writes_needs_invalidation(device):
    """A write through ``param.data`` moves no version counter and no optimizer step:
    ``invalidate_weight_caches()`` makes the next call recompute the weights' operands."""
    cached, plain = _module(device, "fp8_rowwise"), _module(device, "fp8_rowwise", weight_cache=False)
    x, grad, ends = _batch(device)
    _run(cached, x, grad, ends)
    for module in (cached, plain):
        module.w2.data.mul_(0.5)
    tb.invalidate_weight_caches()
    for a, b in zip(_run(cached, x, grad, ends), _run(plain, x, grad, ends), strict=True):
        _same(a, b, "after invalidate_weight_caches")


def test_weight_cache_drops_a_stale_entry_before_recomputing():
    """The stale operands are released before the new ones are made (never both alive)."""
    cache = experts.WeightCache()
    w = torch.ones(4)
    seen = []

    def compute(t):
        seen.append(cache.nbytes())
        return (t * 2,)

    cache.get("w", ("fwd",), w, compute)
    with torch.no_grad():
        w.add_(1)
    cache.get("w", ("fwd",), w, compute)
    assert seen == [0, 0]
    assert torch.equal(cache.get("w", ("fwd",), w, compute)[0], torch.full((4,), 4.0))
    assert len(seen) == 2


@pytest.mark.parametrize(("device", "recipe"), device_recipes(["fp8_rowwise", "mxfp8"]))
def test_no_grad_makes_no_backward_operands(device, recipe, monkeypatch):
    """Under torch.no_grad (evaluation) the forward makes no column (wgrad) operands (mxfp8: no dual
    pass, the single 1x32 pass), and its output equals the training forward's."""
    module = _module(device, recipe)
    x, _, ends = _batch(device)
    if recipe == "fp8_rowwise":
        calls = count_fp8_column_operands(monkeypatch)
    else:  # the dual pass makes mxfp8's column operands
        calls = {"cols": 0}
        original = experts.Mxfp8._both

        def counted(self, t, e):
            calls["cols"] += 1
            return original(self, t, e)

        monkeypatch.setattr(experts.Mxfp8, "_both", counted)
    with torch.no_grad():
        evaluated = module(x, ends)
    assert calls["cols"] == 0
    trained = module(x, ends)
    assert calls["cols"] == 2  # x's for w13, h's for w2
    owned = int(ends[-1])
    _same(evaluated[:owned], trained.detach()[:owned], "no_grad forward")


@pytest.mark.parametrize("device", DEVICES)
def test_graph_keeps_no_dispatch_tokens(device):
    """The block's autograd context holds no reference to a dispatch's quantized tokens: once the
    forward is done, the dispatched rows are referenced only by the caller."""
    import gc
    import weakref

    dim = 64
    module = tb.GroupedExperts(E, dim, H, recipe="fp8_rowwise", gemm=GEMM[device], device=device)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, dim, generator=gen).bfloat16().to(device).requires_grad_()
    ids = torch.randint(0, E, (64, 2), generator=gen).to(device)
    r = ep.dispatch(x, ids, num_experts=E, recipe="fp8_rowwise", alignment=16)
    tokens = r.tokens
    y = module(tokens, r.padded_group_end_offsets)
    watch = weakref.ref(tokens)
    del tokens
    gc.collect()
    assert watch() is None, "the graph keeps the dispatch's tokens alive"
    y.float().sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize(("device", "recipe"), device_recipes(["fp8_rowwise", "mxfp8"]))
def test_aligned_groups_skip_the_pads(device, recipe):
    """Groups that start on the alignment (a dispatch's, pad_token_groups'): the same bits with
    ``groups_aligned=True`` (no pad, no unpad) as through the module's own padding."""
    module = _module(device, recipe)
    x, grad, ends = _batch(device, rows=256, sizes=(0, 64, 128, 64))
    padded = _run(module, x, grad, ends)
    direct = _run(module, x, grad, ends, groups_aligned=True)
    for a, b in zip(padded, direct, strict=True):
        _same(a, b, "aligned")


@pytest.mark.parametrize(("device", "recipe"), device_recipes(["fp8_rowwise", "mxfp8"]))
def test_quantized_tokens_from_a_dispatch(device, recipe):
    """An FP8 dispatch's tokens go into the block without quantizing x again, and x's gradient comes
    back through the dispatch: close to the bf16 dispatch feeding the same block (D = 128: the
    mxfp8 dispatch sends whole 4-byte scale words)."""
    dim = 128
    torch.manual_seed(0)
    gemm = GEMM[device] if recipe == "fp8_rowwise" else "auto"
    module = tb.GroupedExperts(E, dim, H, recipe=recipe, gemm=gemm, device=device)
    gen = torch.Generator().manual_seed(3)
    tokens, topk = 96, 2
    x = torch.randn(tokens, dim, generator=gen).bfloat16().to(device)
    ids = torch.randint(0, E, (tokens, topk), generator=gen).to(device)
    w = torch.rand(tokens, topk, generator=gen).to(device)
    g = torch.randn(tokens, dim, generator=gen).bfloat16().to(device)

    def layer(dispatch_recipe):
        xs = x.clone().requires_grad_()
        module.zero_grad(set_to_none=True)
        r = ep.dispatch(xs, ids, num_experts=E, recipe=dispatch_recipe, alignment=32)
        if dispatch_recipe == "bf16":
            y = module(r.q, r.padded_group_end_offsets, groups_aligned=True)
        else:
            y = module(r.tokens, r.padded_group_end_offsets)
        ep.combine(y, r, w).backward(g)
        return xs.grad, module.w13.grad, module.w2.grad

    quantized, plain = layer(recipe), layer("bf16")
    for a, b in zip(quantized, plain, strict=True):
        assert sqnr_db(a, b) >= 25.0


@pytest.mark.parametrize("device", DEVICES)
def test_scaled_grouped_mm_takes_quantized_tokens(device):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(64, D, generator=gen).bfloat16().to(device).requires_grad_()
    ids = torch.randint(0, E, (64, 1), generator=gen).to(device)
    w = (torch.randn(E, 48, D, generator=gen) / 8).bfloat16().to(device).requires_grad_()
    r = ep.dispatch(x, ids, num_experts=E, recipe="fp8_rowwise", alignment=16)
    y = tb.scaled_grouped_mm(r.tokens, w, r.padded_group_end_offsets, gemm=GEMM[device])
    y.sum().backward()
    ends = r.padded_group_end_offsets
    want = tb.scaled_grouped_mm(r.tokens.dequantized(), w.detach(), ends, recipe="bf16")
    owned = int(ends[-1])  # rows past the last group are unspecified
    assert y.dtype == torch.bfloat16 and sqnr_db(y[:owned], want[:owned]) >= 25.0
    assert x.grad is not None and w.grad is not None


def test_from_weights_shares_the_tensors():
    w13 = torch.randn(E, 2 * H, D).bfloat16()
    w2 = torch.nn.Parameter(torch.randn(E, D, H).bfloat16())
    module = tb.GroupedExperts.from_weights(w13, w2, recipe="bf16")
    assert module.w13.data_ptr() == w13.data_ptr() and module.w2 is w2
    assert set(module.state_dict()) == {"w13", "w2"}


@pytest.mark.parametrize(
    "w13_shape, w2_shape, match",
    [
        ((E, 2 * H, D + 16), (E, D, H), r"GroupedExperts: w13 must have shape \(4, 64, 64\)"),
        ((E, 2 * H, D), (E, D, H + 16), r"GroupedExperts: w2 must have shape \(4, 64, 32\)"),
        ((E, 2 * H, D), (E + 1, D, H), r"GroupedExperts: w2 must have shape \(4, 64, 32\)"),
        ((E, 2 * H + 1, D), (E, D, H), r"GroupedExperts: w13 \(E, 2H, D\) must have an even dim 1"),
    ],
)
def test_errors_name_the_weight(w13_shape, w2_shape, match):
    module = tb.GroupedExperts.from_weights(
        torch.zeros(w13_shape, dtype=torch.bfloat16), torch.zeros(w2_shape, dtype=torch.bfloat16)
    )
    x, _, ends = _batch("cpu")
    with pytest.raises(ValueError, match=match):
        module(x, ends)


def test_bad_options_are_refused_at_construction():
    with pytest.raises(ValueError, match="GroupedExperts: recipe must be one of"):
        tb.GroupedExperts(E, D, H, recipe="fp4")
    with pytest.raises(ValueError, match="GroupedExperts: backend must be one of"):
        tb.GroupedExperts(E, D, H, backend="triton")


def test_quantized_tokens_need_their_own_offsets():
    """Quantized tokens go with their own padded groups: other offsets (even equal values in another
    tensor) are refused by both the op and the module, before any work."""
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(64, D, generator=gen).bfloat16()
    ids = torch.randint(0, E, (64, 1), generator=gen)
    r = ep.dispatch(x, ids, num_experts=E, recipe="fp8_rowwise", alignment=16)
    w = (torch.randn(E, 48, D, generator=gen) / 8).bfloat16()
    other = r.padded_group_end_offsets.clone()
    with pytest.raises(ValueError, match="scaled_grouped_mm: group_end_offsets must be the quantized"):
        tb.scaled_grouped_mm(r.tokens, w, other)
    module = _module("cpu", "fp8_rowwise")
    with pytest.raises(ValueError, match="GroupedExperts: group_end_offsets must be the quantized"):
        module(r.tokens, other)
    module(r.tokens, r.padded_group_end_offsets)  # its own: accepted


def test_token_offsets_identity_compiles():
    """The check that quantized tokens come with their own offsets is an identity test, which
    dynamo evaluates while tracing: a compiled call with the tokens' own offsets runs (CPU: the
    reference outside the graph)."""
    from torch_bindings import checks

    gen = torch.Generator().manual_seed(9)
    x = torch.randn(32, D, generator=gen).bfloat16()
    ids = torch.randint(0, E, (32, 1), generator=gen)
    tokens = ep.dispatch(x, ids, num_experts=E, recipe="fp8_rowwise", alignment=16).tokens

    @torch.compile(backend="eager", fullgraph=True)
    def check(q, offsets):
        checks._check_token_offsets(tokens, offsets, op="op")
        return q + 1

    check(torch.ones(2), tokens.group_end_offsets)
    with pytest.raises(Exception, match="must be the quantized tokens' own"):
        check(torch.ones(2), tokens.group_end_offsets.clone())
