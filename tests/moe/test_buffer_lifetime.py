"""Buffer lifetime (SPEC section 6) and no silent slow path (section 5).

A tensor returned by dispatch or combine, and anything autograd saved from it, stays valid while it
is referenced: models of several MoE layers (dispatch -> grouped GEMM -> combine) give the same
gradients bit for bit as the same model with every dispatched ``q`` cloned, also under activation
checkpointing and with two micro-batches in flight. Every pooled buffer is read from two results
held at once. The slot ring that reuses symmetric-memory buffers across GPUs is checked here on
plain tensors (tests/support/ep_multigpu.py runs it on symmetric memory).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_bindings as tb
from tests.conftest import no_sync
from tests.support.ep_cases import Layer, assert_grads_equal, assert_same, layer_grads
from torch_bindings import backend, ep
from torch_bindings import reference as ref

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
TOKENS, DIM, TOPK, EXPERTS = 64, 128, 2, 4


def _layers(device, recipes, seed: int = 0) -> list[Layer]:
    gen = torch.Generator().manual_seed(seed)
    return [Layer(gen, device, recipe, TOKENS, DIM, TOPK, EXPERTS, 1) for recipe in recipes]


def _inputs(device, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(TOKENS, DIM, generator=gen).bfloat16().to(device)
    grad = torch.randn(TOKENS, DIM, generator=gen).bfloat16().to(device)
    return x, grad


@pytest.mark.parametrize("device", DEVICES)
def test_two_layers_bit_identical_to_cloned_q(device):
    """The reported model: two bf16 layers, the first layer's weight gradient was corrupted by the
    second dispatch writing the buffer the first GEMM saved."""
    layers = _layers(device, ["bf16", "bf16"])
    x, grad = _inputs(device)
    plain = layer_grads(layers, x, grad, clone=True)
    assert_grads_equal(layer_grads(layers, x, grad, clone=False), plain, "2 layers")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "recipes",
    [("bf16", "fp8_rowwise", "bf16"), ("fp8_rowwise", "mxfp8", "bf16", "fp8_rowwise")],
    ids=["3 layers", "4 layers"],
)
def test_layers_of_mixed_recipes(device, recipes):
    layers = _layers(device, recipes, seed=len(recipes))
    x, grad = _inputs(device)
    plain = layer_grads(layers, x, grad, clone=True)
    assert_grads_equal(layer_grads(layers, x, grad, clone=False), plain, "mixed")


@pytest.mark.parametrize("device", DEVICES)
def test_checkpointed_layer(device):
    """The middle layer recomputed under torch.utils.checkpoint: its dispatch runs again during the
    backward while the other layers' results are alive."""
    layers = _layers(device, ["bf16", "fp8_rowwise", "bf16"], seed=3)
    x, grad = _inputs(device)
    plain = layer_grads(layers, x, grad, clone=True)
    assert_grads_equal(layer_grads(layers, x, grad, clone=False, checkpointed=(1,)), plain, "checkpoint")
    assert_grads_equal(layer_grads(layers, x, grad, clone=False, checkpointed=(0, 2)), plain, "checkpoint")


@pytest.mark.parametrize("device", DEVICES)
def test_two_micro_batches_in_flight(device):
    """Both micro-batches' forwards before either backward (their saved dispatch rows alive at once),
    gradients accumulated: the same as one micro-batch after the other with cloned q."""
    layers = _layers(device, ["bf16", "bf16"], seed=5)
    (x1, g1), (x2, g2) = _inputs(device, 11), _inputs(device, 12)

    def forward(x, clone):
        out = x.clone().requires_grad_()
        for layer in layers:
            out = layer(out, clone)
        return out

    def accumulated(interleaved: bool) -> list[torch.Tensor]:
        for layer in layers:
            layer.w.grad = layer.weights.grad = None
        if interleaved:
            a, b = forward(x1, False), forward(x2, False)
            a.backward(g1)
            b.backward(g2)
        else:
            forward(x1, True).backward(g1)
            forward(x2, True).backward(g2)
        return [t.grad.clone() for layer in layers for t in (layer.w, layer.weights)]

    assert_grads_equal(accumulated(True), accumulated(False), "micro-batches")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["bf16", "fp8_rowwise", "mxfp8"])
def test_two_dispatch_results_held_and_read(device, recipe):
    gen = torch.Generator().manual_seed(7)
    xs = [torch.randn(TOKENS, DIM, generator=gen).bfloat16().to(device) for _ in range(2)]
    ids = [torch.randint(0, EXPERTS, (TOKENS, TOPK), generator=gen).to(device) for _ in range(2)]
    results = [ep.dispatch(x, i, num_experts=EXPERTS, recipe=recipe) for x, i in zip(xs, ids, strict=True)]
    for n, (x, i, got) in enumerate(zip(xs, ids, results, strict=True)):
        want = ref.ep_dispatch([x], [i], EXPERTS, recipe=recipe)[0]
        assert_same(got.q, want["q"], f"result {n} q")
        if recipe != "bf16":
            assert_same(got.scales, want["scales"], f"result {n} scales")


@pytest.mark.parametrize("device", DEVICES)
def test_two_combine_results_and_their_gradients_held(device):
    """Two combines (one combine buffer) and, in backward, two gradient dispatches (combine's
    backward buffers) whose results are both held until the end."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(TOKENS, DIM, generator=gen).bfloat16().to(device)
    ids = [torch.randint(0, EXPERTS, (TOKENS, TOPK), generator=gen).to(device) for _ in range(2)]
    ws = [torch.rand(TOKENS, TOPK, generator=gen).to(device) for _ in range(2)]
    g = torch.randn(TOKENS, DIM, generator=gen).bfloat16().to(device)
    kept: list[torch.Tensor] = []
    outs, ys, results = [], [], []
    for i, w in zip(ids, ws, strict=True):
        r = ep.dispatch(x, i, num_experts=EXPERTS, recipe="bf16")
        y = (r.q.float() * 3 - 1).bfloat16().requires_grad_()
        y.register_hook(kept.append)  # the gradient dispatch's result, held past the next one
        outs.append(ep.combine(y, r, w))
        ys.append(y)
        results.append(r)
    for n, (i, w, y, out) in enumerate(zip(ids, ws, ys, outs, strict=True)):
        disp = ref.ep_dispatch([x], [i], EXPERTS, recipe="bf16")[0]
        assert_same(out, ref.ep_combine([y.detach()], disp["pair_rows"], [w])[0], f"combine {n}")
    (outs[0].float() + outs[1].float()).mul(g.float()).sum().backward()
    assert len(kept) == 2
    for n, (i, w) in enumerate(zip(ids, ws, strict=True)):
        per_pair = (g.float()[:, None] * w[:, :, None]).bfloat16()
        want = ref.ep_dispatch([per_pair], [i], EXPERTS, recipe="bf16")[0]["q"]
        assert_same(kept[1 - n], want, f"gradient dispatch {n}")  # hooks fire in reverse order


class _PlainRing(ep.SlotRing):
    """The slot ring on plain tensors (no process group): what SymmetricPool reuses."""

    def _allocate(self, family, kinds, index, counts):
        views = {}
        for name, (shape, dtype) in kinds.items():
            own = torch.zeros(shape, dtype=dtype)
            ptrs = torch.full((1,), own.data_ptr(), dtype=torch.int64)
            views[name] = ep.SharedRows(own, ptrs, ptrs, [own])
        return ep.Slot({0: views}, torch.zeros(1, dtype=torch.int32), index)


class _RingPool(_PlainRing):
    """A one-rank pool that reuses slots as SymmetricPool does (R = 1's own path allocates per call):
    the public ops on CPU through the slot ring."""

    ranks = 1

    def exchange_counts(self, routing, slot):
        return routing.counts[None]

    def barrier(self) -> None:
        pass


def _slots_in_use(ring) -> dict:
    return {
        family[0] if isinstance(family, tuple) else family: [not ep._slot_free(s, 0) for s in slots]
        for family, slots in ring._families.items()
    }


@pytest.mark.parametrize("recipe", ["bf16", "fp8_rowwise", "mxfp8"])
def test_a_kept_graph_pins_no_slot(monkeypatch, recipe):
    """dispatch -> a function that saves nothing -> combine, the output (and so the graph) kept: the
    autograd contexts hold the routing only, so every slot is free; after backward too."""
    ring = _RingPool()
    monkeypatch.setattr(ep, "_pool", lambda group, device: ring)
    gen = torch.Generator().manual_seed(21)
    x = torch.randn(TOKENS, DIM, generator=gen).bfloat16().requires_grad_()
    ids = torch.randint(0, EXPERTS, (TOKENS, TOPK), generator=gen)
    w = torch.rand(TOKENS, TOPK, generator=gen).requires_grad_()
    r = ep.dispatch(x, ids, num_experts=EXPERTS, recipe=recipe)
    rows = r.q if recipe == "bf16" else r.tokens.dequantized() + r.grad_anchor
    out = ep.combine((rows * 2).bfloat16(), r, w)
    assert _slots_in_use(ring)["dispatch"] == [True]  # r still views its rows
    del r, rows
    in_use = _slots_in_use(ring)
    assert not any(any(v) for v in in_use.values()), in_use
    out.float().sum().backward()
    in_use = _slots_in_use(ring)
    assert "grad" in in_use and not any(any(v) for v in in_use.values()), in_use
    assert out.grad_fn is not None and x.grad is not None and w.grad is not None


@pytest.mark.parametrize("recipe", ["fp8_rowwise", "mxfp8"])
def test_fp8_experts_free_the_dispatch_slot_after_forward(monkeypatch, recipe):
    """The experts on an FP8 dispatch's tokens save their own column operand: once the forward is
    done the graph needs none of the dispatched rows, so their slot is free."""
    ring = _RingPool()
    monkeypatch.setattr(ep, "_pool", lambda group, device: ring)
    experts = tb.GroupedExperts(EXPERTS, DIM, 64, recipe=recipe)
    x = torch.randn(TOKENS, DIM).bfloat16().requires_grad_()
    ids = torch.randint(0, EXPERTS, (TOKENS, TOPK))
    r = ep.dispatch(x, ids, num_experts=EXPERTS, recipe=recipe)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the emulated GEMMs on CPU
        y = experts(r.tokens, r.padded_group_end_offsets, groups_aligned=True)
    out = ep.combine(y, r, torch.rand(TOKENS, TOPK))
    del r, y
    assert _slots_in_use(ring)["dispatch"] == [False]
    assert out.grad_fn is not None


@pytest.mark.parametrize("recipe", ["bf16", "mxfp8"])
def test_contexts_save_through_saved_tensor_hooks(recipe):
    """Everything dispatch's and combine's backward read is saved with save_for_backward: saved-tensor
    hooks (activation checkpointing, offloading) see the pair rows and the routing, and the backward
    frees them while the output is kept."""
    import weakref

    gen = torch.Generator().manual_seed(22)
    x = torch.randn(TOKENS, DIM, generator=gen).bfloat16().requires_grad_()
    ids = torch.randint(0, EXPERTS, (TOKENS, TOPK), generator=gen)
    w = torch.rand(TOKENS, TOPK, generator=gen).requires_grad_()
    packed: list = []

    def pack(t):
        packed.append((tuple(t.shape), t.dtype, weakref.ref(t)))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        r = ep.dispatch(x, ids, num_experts=EXPERTS, recipe=recipe)
        y = r.q if recipe == "bf16" else r.tokens.dequantized() + r.grad_anchor
        out = ep.combine((y * 2).bfloat16(), r, w)
    shapes = [(shape, dtype) for shape, dtype, _ in packed]
    assert ((TOKENS, TOPK, DIM), torch.bfloat16) in shapes  # combine's pair rows
    assert shapes.count(((TOKENS * TOPK,), torch.int32)) == 2  # both contexts' dst_index
    del r, y
    out.float().sum().backward()
    alive = [shape for shape, _, ref in packed if ref() is not None and shape != (TOKENS, TOPK)]
    assert not alive, alive  # only w itself (a leaf the test holds) outlives the backward


def test_slot_ring_never_hands_out_a_live_slot():
    ring = _PlainRing()
    kinds = {"q": ((8, 4), torch.bfloat16), "tags": ((8, 1), torch.int32)}
    first = ring.acquire("f", kinds)
    q1 = first.views[0]["q"].own.view(8, 4)  # a result's view: the slot is in use
    second = ring.acquire("f", kinds)
    assert second is not first and len(ring.slots("f")) == 2
    saved = second.views[0]["q"].own[2:]  # e.g. autograd's saved slice
    assert ring.acquire("f", kinds) not in (first, second)
    del q1
    assert ring.acquire("f", kinds) is first  # free again: reused, no allocation
    del saved
    assert ring.acquire("f", kinds) is first and len(ring.slots("f")) == 3
    assert ring.acquire("g", kinds) is not first  # families never share slots


def test_slot_ring_refuses_to_grow_past_its_limit(monkeypatch):
    monkeypatch.setattr(ep, "MAX_SLOTS", 2)
    ring = _PlainRing()
    kinds = {"q": ((4, 4), torch.bfloat16)}
    held = [ring.acquire("f", kinds).views[0]["q"].own.view(4, 4) for _ in range(2)]
    with pytest.raises(RuntimeError, match="results of one buffer family are alive at once"):
        ring.acquire("f", kinds)
    assert len(held) == 2


def test_local_results_own_their_rows():
    """R = 1: every dispatch gets rows of its own (no pool): a result's q is never another call's."""
    x = torch.randn(TOKENS, DIM).bfloat16()
    ids = torch.randint(0, EXPERTS, (TOKENS, TOPK))
    a = ep.dispatch(x, ids, num_experts=EXPERTS, recipe="bf16")
    b = ep.dispatch(x, ids, num_experts=EXPERTS, recipe="bf16")
    assert a.q.untyped_storage().data_ptr() != b.q.untyped_storage().data_ptr()


# --- No silent slow path ------------------------------------------------------------------------------


def _no_kernels_on_cuda(monkeypatch, reason: str) -> None:
    def kernel_arch(device):
        return (None, reason) if device.type == "cuda" else (None, "tensors are on cpu")

    monkeypatch.setattr(backend, "kernel_arch", kernel_arch)


def test_auto_on_a_gpu_without_kernels_raises_naming_what_is_missing(monkeypatch):
    _no_kernels_on_cuda(monkeypatch, "nvidia-cutlass-dsl is not importable (ImportError: no cutlass)")
    message = r"quantize_fp8_2d: backend='auto' cannot run.*cutlass.*'reference'"
    with pytest.raises(RuntimeError, match=message):
        backend.select("quantize_fp8_2d", "auto", torch.device("cuda", 0))
    assert backend.select("quantize_fp8_2d", "reference", torch.device("cuda", 0)) is None
    assert backend.select("quantize_fp8_2d", "auto", torch.device("cpu")) is None  # CPU: the reference
    with pytest.raises(RuntimeError, match="backend='cute' cannot run"):
        backend.select("quantize_fp8_2d", "cute", torch.device("cpu"))


@pytest.mark.parametrize("recipe", ["fp8_rowwise", "mxfp8"])
def test_quantized_tokens_dequantized_honours_the_backend(monkeypatch, recipe):
    """QuantizedTokens.dequantized resolves ``backend`` as the ops do (backend.select: "cute" where
    no kernel runs and "auto" on a GPU without the kernels raise); "reference" runs."""
    x, ids = torch.randn(TOKENS, DIM).bfloat16(), torch.randint(0, EXPERTS, (TOKENS, TOPK))
    tokens = ep.dispatch(x, ids, num_experts=EXPERTS, recipe=recipe).tokens
    want = tokens.dequantized()
    assert_same(tokens.dequantized(backend="reference"), want, "reference")
    with pytest.raises(RuntimeError, match="backend='cute' cannot run"):
        tokens.dequantized(backend="cute")
    seen = []
    monkeypatch.setattr(backend, "select", lambda op, b, device: seen.append(b))  # what the ops call
    tokens.dequantized(backend="cute")
    assert seen == ["cute"]


def test_capabilities_report_each_path(monkeypatch):
    cpu = tb.capabilities("cpu")
    assert set(cpu.ops.values()) == {"reference"} and cpu.gemm["bf16"] == "native"
    assert cpu.gemm["fp8_rowwise"] == "emulated" and "quantize_fp8_2d" in str(cpu)
    _no_kernels_on_cuda(monkeypatch, "GPU capability (8, 0) is not supported")
    monkeypatch.setattr(tb.moe.grouped_mm, "native_gemm_reason", lambda recipe, device: None)
    gpu = tb.capabilities(torch.device("cuda", 0))
    assert set(gpu.ops.values()) == {"unavailable"} and "(8, 0)" in gpu.reason


@pytest.mark.gpu
def test_capabilities_on_this_gpu():
    caps = tb.capabilities("cuda")
    assert set(caps.ops.values()) == {"cute"} and caps.arch in ("sm_90a", "sm_100a")
    own = tb.moe.grouped_mm.auto_runs_own_gemm("fp8_rowwise", torch.device("cuda"))
    assert caps.gemm["fp8_rowwise"] == ("cute" if own else "native")


@pytest.mark.gpu
def test_layers_do_not_sync_once_warm():
    layers = _layers("cuda", ["bf16", "fp8_rowwise"], seed=13)
    x, grad = _inputs("cuda")
    layer_grads(layers, x, grad, clone=False)
    with no_sync():
        layer_grads(layers, x, grad, clone=False)
